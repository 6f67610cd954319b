package transfer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"time"
)

// The operators' action log is hash-chained: each row stores
// Hash = sha256(PrevHash || Canonical(row)), PrevHash being the hash of the row before it
// (GenesisHash for the first), and sequence numbers follow each other without a gap. A row
// changed afterwards no longer matches its hash; a row removed breaks the link of the row
// after it; the newest rows removed are found against a head noted earlier (Seq and Hash).

// GenesisHash is the PrevHash of the first row of an action log.
var GenesisHash = make([]byte, sha256.Size)

// Action is one recorded operator action: who (the role and name of the client certificate,
// or of the console login), by which door (Via: grpc or console), what (Action, Target, and
// the request as Detail), when, and the result ("ok", or the error).
type Action struct {
	Seq                              int64
	At                               time.Time
	Role, Actor, Via, Action, Target string
	Detail, Result                   string
	PrevHash, Hash                   []byte
}

// Canonical is the action's fields as hashed: the sequence number and the time (Unix
// microseconds, as the database keeps it) as 8 bytes each, big-endian, then every text
// field as its length (4 bytes, big-endian) and its bytes, in a fixed order.
func (a Action) Canonical() []byte {
	var b bytes.Buffer
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(a.Seq))
	b.Write(n[:])
	binary.BigEndian.PutUint64(n[:], uint64(a.At.UnixMicro()))
	b.Write(n[:])
	for _, s := range []string{a.Role, a.Actor, a.Via, a.Action, a.Target, a.Detail, a.Result} {
		binary.BigEndian.PutUint32(n[:4], uint32(len(s)))
		b.Write(n[:4])
		b.WriteString(s)
	}
	return b.Bytes()
}

// ActionHash is sha256(prev || a.Canonical()).
func ActionHash(prev []byte, a Action) []byte {
	h := sha256.New()
	h.Write(prev)
	h.Write(a.Canonical())
	return h.Sum(nil)
}

// ChainError is the first row of an action log that does not follow from the rows before it.
type ChainError struct {
	Seq int64
	Why string
}

// Error says which row and why.
func (e *ChainError) Error() string { return fmt.Sprintf("action log row %d: %s", e.Seq, e.Why) }

// ChainState is how far a verification has come: the last row's sequence number and hash
// (0 and GenesisHash before the first row).
type ChainState struct {
	Seq  int64
	Hash []byte
}

// Verify checks rows, which follow st, and returns the state after them, or the first row
// that was changed (its hash does not match its fields), or that follows a removed or
// changed row (its PrevHash or Seq does not follow the row before).
func (st ChainState) Verify(rows []Action) (ChainState, error) {
	for _, a := range rows {
		switch {
		case a.Seq != st.Seq+1:
			return st, &ChainError{a.Seq, fmt.Sprintf("follows row %d: rows %d..%d are missing", st.Seq, st.Seq+1, a.Seq-1)}
		case !bytes.Equal(a.PrevHash, st.Hash):
			return st, &ChainError{a.Seq, fmt.Sprintf("its previous hash %s is not row %d's hash %s: row %d was changed or replaced",
				short(a.PrevHash), st.Seq, short(st.Hash), st.Seq)}
		case !bytes.Equal(a.Hash, ActionHash(st.Hash, a)):
			return st, &ChainError{a.Seq, "its fields do not match its hash: the row was changed"}
		}
		st = ChainState{Seq: a.Seq, Hash: a.Hash}
	}
	return st, nil
}

func short(h []byte) string {
	s := hex.EncodeToString(h)
	return s[:min(len(s), 16)]
}
