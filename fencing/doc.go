// Package fencing is the only package that talks to etcd. It elects leaders (the
// coordinator, and each region's writer), turns leadership into a number that only rises
// (a coordinator's generation, a region leader's epoch: the leader key's create revision),
// and holds the SQL predicates that make a stale leader's writes change nothing (I4).
//
// SQL tables the predicates rely on (created by the region and coordinator migrations):
//
//	sale_fences(sale_id text primary key, generation bigint)       -- region: highest coordinator generation per sale
//	leader_epoch(id int primary key, epoch bigint)                  -- region: epoch of the current writer (one row, id 1)
//	ledger_fence(id int primary key, generation bigint)             -- coordinator: generation of the current leader (one row, id 1)
package fencing

import (
	"errors"

	"github.com/quotaworks/quota/internal/apierr"
)

// ErrFenced is returned when a generation or epoch is below one already recorded.
var ErrFenced = apierr.ErrFenced

// ErrNotLeader is returned when an operation needs leadership this process does not hold.
var ErrNotLeader = apierr.ErrNotLeader

// ErrSessionExpired is returned by Campaign when the candidate's etcd session expired while
// it waited to lead: it was no longer a candidate, and campaigns again under a new session.
var ErrSessionExpired = errors.New("etcd session expired")
