package transfer_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/quotaworks/quota/transfer"
	"pgregory.net/rapid"
)

// chain makes a well-formed action log of the drawn rows.
func chain(t *rapid.T) []transfer.Action {
	n := rapid.IntRange(1, 12).Draw(t, "rows")
	prev := transfer.GenesisHash
	rows := make([]transfer.Action, n)
	base := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for i := range rows {
		a := transfer.Action{Seq: int64(i + 1), At: base.Add(time.Duration(rapid.IntRange(0, 1e9).Draw(t, "us")) * time.Microsecond),
			Role: rapid.SampledFrom([]string{"operator", "auditor", ""}).Draw(t, "role"), Actor: rapid.String().Draw(t, "actor"),
			Via: rapid.SampledFrom([]string{"grpc", "console"}).Draw(t, "via"), Action: rapid.String().Draw(t, "action"),
			Target: rapid.String().Draw(t, "target"), Detail: rapid.String().Draw(t, "detail"), Result: rapid.String().Draw(t, "result"),
			PrevHash: prev}
		a.Hash = transfer.ActionHash(prev, a)
		rows[i], prev = a, a.Hash
	}
	return rows
}

// change alters one field of a row, as someone editing the table would, and says which.
func change(t *rapid.T, a *transfer.Action, fields int) string {
	field := rapid.IntRange(0, fields-1).Draw(t, "field")
	flip := func(s string) string { return s + "x" }
	switch field {
	case 0:
		a.Seq += int64(rapid.IntRange(1, 3).Draw(t, "seq+"))
	case 1:
		a.At = a.At.Add(time.Microsecond)
	case 2:
		a.Role = flip(a.Role)
	case 3:
		a.Actor = flip(a.Actor)
	case 4:
		a.Via = flip(a.Via)
	case 5:
		a.Action = flip(a.Action)
	case 6:
		a.Target = flip(a.Target)
	case 7:
		a.Detail = flip(a.Detail)
	case 8:
		a.Result = flip(a.Result)
	case 9:
		a.PrevHash = append(slices.Clone(a.PrevHash[:len(a.PrevHash)-1]), a.PrevHash[len(a.PrevHash)-1]^1)
	default:
		a.Hash = append(slices.Clone(a.Hash[:len(a.Hash)-1]), a.Hash[len(a.Hash)-1]^1)
	}
	return []string{"seq", "at", "role", "actor", "via", "action", "target", "detail", "result", "prev_hash", "hash"}[field]
}

// TestActionChainDetectsAnyChangeOrRemoval: an untouched log verifies; any single field of
// any single row changed, and any single row removed, is found, at that row or the one after
// it; the newest row removed is found against the head noted before. A changed row whose
// hash is recomputed to match is still found, by the next row's link.
func TestActionChainDetectsAnyChangeOrRemoval(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rows := chain(t)
		head, err := transfer.ChainState{Seq: 0, Hash: transfer.GenesisHash}.Verify(rows)
		if err != nil || head.Seq != int64(len(rows)) || !bytes.Equal(head.Hash, rows[len(rows)-1].Hash) {
			t.Fatalf("a well-formed log: %v, head %+v", err, head)
		}
		i := rapid.IntRange(0, len(rows)-1).Draw(t, "row")
		tampered := slices.Clone(rows)
		switch rapid.IntRange(0, 2).Draw(t, "how") {
		case 0:
			field := change(t, &tampered[i], 11)
			found(t, tampered, head, i, "changed "+field)
		case 1: // changed, and its hash made to match (the hash itself left out: that is no change)
			field := change(t, &tampered[i], 10)
			tampered[i].Hash = transfer.ActionHash(tampered[i].PrevHash, tampered[i])
			found(t, tampered, head, i, "changed "+field+" and rehashed")
		default:
			tampered = slices.Delete(tampered, i, i+1)
			found(t, tampered, head, i, "removed")
		}
	})
}

// found fails unless verifying rows finds a ChainError at the row at index i (the changed
// row, or the one after a removed one) or the row after it, or, when every row verifies (the
// newest row removed or rehashed), the state reached is not the head noted before.
func found(t *rapid.T, rows []transfer.Action, head transfer.ChainState, i int, what string) {
	st, err := transfer.ChainState{Seq: 0, Hash: transfer.GenesisHash}.Verify(rows)
	var at []int64
	for _, j := range []int{i, i + 1} {
		if j < len(rows) {
			at = append(at, rows[j].Seq)
		}
	}
	var ce *transfer.ChainError
	switch {
	case errors.As(err, &ce):
		if !slices.Contains(at, ce.Seq) {
			t.Fatalf("row at %d %s: found at row %d, want one of %v (%v)", i, what, ce.Seq, at, err)
		}
	case err != nil:
		t.Fatalf("row at %d %s: %v", i, what, err)
	case st.Seq == head.Seq && bytes.Equal(st.Hash, head.Hash):
		t.Fatalf("row at %d %s: not found (the log verifies up to the same head)", i, what)
	}
}
