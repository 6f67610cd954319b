// Package linearize checks histories of Reserve, Confirm and Release on one pool (one sale,
// one SKU, one region) for linearizability with porcupine: every answer a client saw must be
// explained by some order of the operations, each taking effect at one instant between its
// call and its return, on a sequential pool.
//
// The sequential pool: `available` units; holds by id, each held or sold (a released hold is
// forgotten: any later Confirm of it must refund, any Release is a no-op); reserves whose
// outcome is unknown but may have taken units, by (user, request key). A Reserve of q units
// either takes q units (Held) or, when fewer than q are available, answers Empty; Confirm of a
// held hold sells it; Release of a held hold returns its units. An operation whose outcome the
// client never learned (Unknown) may or may not have taken effect: the model follows both.
package linearize

import (
	"fmt"
	"hash/fnv"
	"maps"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"
)

// Kind is the operation a client called.
type Kind uint8

// The operations on a pool.
const (
	Reserve Kind = iota + 1
	Confirm
	Release
)

// String names the kind.
func (k Kind) String() string {
	switch k {
	case Reserve:
		return "Reserve"
	case Confirm:
		return "Confirm"
	case Release:
		return "Release"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Input is an operation as called: Reserve uses User, Key and Qty; Confirm uses Hold and
// Payment; Release uses Hold.
type Input struct {
	Kind    Kind
	User    string
	Key     string
	Qty     int64
	Hold    string
	Payment string
}

// Result is what a client was told.
type Result uint8

// The results. Unknown is an operation whose outcome the client never learned (a timeout,
// Unavailable, UNKNOWN_OUTCOME, a lost connection): the model accepts it either way.
const (
	Unknown  Result = iota
	Held            // Reserve: granted, Output.Hold is the hold
	Empty           // Reserve: REGION_EXHAUSTED or SOLD_OUT
	Limit           // Reserve: LIMIT_EXCEEDED
	Sold            // Confirm: the hold is sold
	Refund          // Confirm: the hold was no longer held; refund
	Released        // Release: the hold is released (now or before)
	Conflict        // Release: the hold is sold
	NotFound        // Confirm or Release: the region does not know the hold
)

var resultNames = [...]string{"unknown", "held", "empty", "limit", "sold", "refund", "released", "conflict", "not-found"}

// String names the result.
func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("Result(%d)", uint8(r))
}

// Output is an operation's answer.
type Output struct {
	Result Result
	Hold   string // Reserve answered Held: the hold's id
}

type holdState uint8

const (
	stHeld holdState = iota + 1
	stSold
)

type hold struct {
	user  string
	qty   int64
	state holdState
}

// state is immutable: steps copy what they change.
type state struct {
	avail int64
	holds map[string]hold  // held or sold; released holds are dropped
	anon  map[string]int64 // user+"\x00"+key → units of a reserve with an unknown outcome that took them
}

func (s state) withHolds() state {
	s.holds = maps.Clone(s.holds)
	return s
}

func (s state) usage(user string) int64 {
	var n int64
	for _, h := range s.holds {
		if h.user == user {
			n += h.qty
		}
	}
	for k, q := range s.anon {
		if strings.HasPrefix(k, user+"\x00") {
			n += q
		}
	}
	return n
}

// Pool is the sequential specification of one pool.
type Pool struct {
	Units int64 // available at the start
	Limit int64 // per-user limit on held + sold units; 0: none
}

// Model is the porcupine model of the pool (a power-set construction over the states the
// unknown outcomes leave possible).
func (p Pool) Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any {
			return []any{state{avail: p.Units, holds: map[string]hold{}, anon: map[string]int64{}}}
		},
		Step: func(st, in, out any) []any {
			s, i, o := st.(state), in.(Input), out.(Output)
			var next []state
			switch i.Kind {
			case Reserve:
				next = p.reserve(s, i, o)
			case Confirm:
				next = confirm(s, i, o)
			case Release:
				next = release(s, i, o)
			}
			res := make([]any, len(next))
			for k, n := range next {
				res[k] = n
			}
			return res
		},
		Equal:             func(a, b any) bool { return equal(a.(state), b.(state)) },
		Hash:              func(s any) uint64 { return hashState(s.(state)) },
		DescribeOperation: describe,
		DescribeState:     func(s any) string { return describeState(s.(state)) },
	}
	return nm.ToModel()
}

func (p Pool) reserve(s state, in Input, out Output) []state {
	key := in.User + "\x00" + in.Key
	if _, took := s.anon[key]; took { // an earlier call with this key may have taken the units
		switch out.Result {
		case Unknown:
			return []state{s}
		case Held: // the replay names the hold the earlier call made
			n := s.withHolds()
			n.anon = maps.Clone(s.anon)
			delete(n.anon, key)
			n.holds[out.Hold] = hold{user: in.User, qty: in.Qty, state: stHeld}
			return []state{n}
		}
		return nil
	}
	fits := s.avail >= in.Qty
	withinLimit := p.Limit == 0 || s.usage(in.User)+in.Qty <= p.Limit
	switch out.Result {
	case Held:
		if h, ok := s.holds[out.Hold]; ok { // a replay of a reserve already answered
			if h.user == in.User && h.qty == in.Qty {
				return []state{s}
			}
			return nil
		}
		if !fits || !withinLimit {
			return nil
		}
		n := s.withHolds()
		n.avail -= in.Qty
		n.holds[out.Hold] = hold{user: in.User, qty: in.Qty, state: stHeld}
		return []state{n}
	case Empty:
		if fits {
			return nil
		}
		return []state{s}
	case Limit:
		if withinLimit {
			return nil
		}
		return []state{s}
	case Unknown:
		if !fits || !withinLimit {
			return []state{s}
		}
		n := s
		n.avail -= in.Qty
		n.anon = maps.Clone(s.anon)
		n.anon[key] = in.Qty
		return []state{s, n}
	}
	return nil
}

func confirm(s state, in Input, out Output) []state {
	h, ok := s.holds[in.Hold]
	switch {
	case !ok: // released (every hold id a client confirms came from an earlier Reserve)
		if out.Result == Refund || out.Result == Unknown {
			return []state{s}
		}
	case h.state == stHeld:
		n := s.withHolds()
		h.state = stSold
		n.holds[in.Hold] = h
		switch out.Result {
		case Sold:
			return []state{n}
		case Unknown:
			return []state{s, n}
		}
	case h.state == stSold: // sold: the same payment is told sold again, another refunded
		if out.Result == Sold || out.Result == Refund || out.Result == Unknown {
			return []state{s}
		}
	}
	return nil
}

func release(s state, in Input, out Output) []state {
	h, ok := s.holds[in.Hold]
	switch {
	case !ok:
		if out.Result == Released || out.Result == Unknown {
			return []state{s}
		}
	case h.state == stHeld:
		n := s.withHolds()
		delete(n.holds, in.Hold)
		n.avail += h.qty
		switch out.Result {
		case Released:
			return []state{n}
		case Unknown:
			return []state{s, n}
		}
	case h.state == stSold:
		if out.Result == Conflict || out.Result == Unknown {
			return []state{s}
		}
	}
	return nil
}

func equal(a, b state) bool {
	return a.avail == b.avail && maps.Equal(a.holds, b.holds) && maps.Equal(a.anon, b.anon)
}

func hashState(s state) uint64 {
	h := uint64(s.avail) * 0x9e3779b97f4a7c15
	for id, v := range s.holds {
		f := fnv.New64a()
		fmt.Fprintf(f, "%s|%d|%d", id, v.qty, v.state)
		h ^= f.Sum64()
	}
	for k, q := range s.anon {
		f := fnv.New64a()
		fmt.Fprintf(f, "a|%s|%d", k, q)
		h ^= f.Sum64()
	}
	return h
}

func describe(in, out any) string {
	i, o := in.(Input), out.(Output)
	switch i.Kind {
	case Reserve:
		return fmt.Sprintf("Reserve(%s,%s,%d) → %s %s", i.User, i.Key, i.Qty, o.Result, o.Hold)
	case Confirm:
		return fmt.Sprintf("Confirm(%s,%s) → %s", i.Hold, i.Payment, o.Result)
	}
	return fmt.Sprintf("%s(%s) → %s", i.Kind, i.Hold, o.Result)
}

func describeState(s state) string {
	held, sold := 0, 0
	for _, h := range s.holds {
		if h.state == stHeld {
			held++
		} else {
			sold++
		}
	}
	anon := make([]string, 0, len(s.anon))
	for k := range s.anon {
		anon = append(anon, strings.ReplaceAll(k, "\x00", "/"))
	}
	sort.Strings(anon)
	return fmt.Sprintf("available %d, %d held, %d sold, maybe taken %v", s.avail, held, sold, anon)
}
