package coordhttp

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
)

const (
	// MaxSessions bounds the console's logged-in sessions: MaxSessionsPerRole for each of
	// the LoginRoles.
	MaxSessions = MaxSessionsPerRole * 2
	// MaxSessionsPerRole is each login role's share of the table. A login of a role whose
	// share is full ends that role's least recently used session, never another role's: the
	// auditors' logins cannot take the operators' share, so an operator can always log in.
	MaxSessionsPerRole = 512
	// MaxSessionsPerToken bounds the sessions of one login token (a browser each); a login
	// past it ends the token's least recently used session.
	MaxSessionsPerToken = 8
	// SessionTTL is the longest a session lives (less when its token expires sooner).
	SessionTTL = 12 * time.Hour
	// CookieName is the session cookie's name.
	CookieName = "quota_console"
)

// session is one login: the role and name its token named, when it ends, and the CSRF token
// every change it asks for must carry.
type session struct {
	keyID   string // the console key that signed its token: the session ends with the key
	role    trust.Role
	name    string
	csrf    string
	expires time.Time
}

// tokenID names a login token in the table and the limiter: the SHA-256 of its text (a
// token is kept nowhere).
type tokenID [32]byte

// entry is a session as the table keeps it: with its token and when it was last used.
type entry struct {
	session
	token tokenID
	used  time.Time // its login or its latest request
}

// sessions are the console's logins, by the SHA-256 of their cookie (the cookie itself is
// kept nowhere): at most perToken of one token and perRole of one role, so at most
// perRole × len(LoginRoles) in all. Each token's sessions and each role's count are indexed,
// so the bounds cost nothing to check.
type sessions struct {
	mu       sync.Mutex
	m        map[[32]byte]*entry
	byToken  map[tokenID][][32]byte
	byRole   map[trust.Role]int
	perToken int
	perRole  int
}

func newSessions(perToken, perRole int) *sessions {
	return &sessions{m: map[[32]byte]*entry{}, byToken: map[tokenID][][32]byte{}, byRole: map[trust.Role]int{},
		perToken: perToken, perRole: perRole}
}

// randomText is n random bytes in unpadded base64url.
func randomText(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// create starts a session for a verified token (tok is its tokenID) and returns its cookie
// value and how many sessions it ended to make room: past the token's bound its least
// recently used one; with its role's share full the expired sessions, then the role's least
// recently used one. A login is never refused for room: refusing would let whoever holds a
// token (or a role's many tokens) lock the others out until their sessions expire, while an
// ended session's holder only logs in again.
func (s *sessions) create(t Token, tok tokenID, now time.Time) (string, session, int, error) {
	if !loginRole(t.Role) {
		return "", session{}, 0, apierr.Invalid("role", "%q: a console login is operator or auditor", t.Role)
	}
	id, err := randomText(32)
	if err != nil {
		return "", session{}, 0, err
	}
	csrf, err := randomText(32)
	if err != nil {
		return "", session{}, 0, err
	}
	sess := session{keyID: t.KeyID, role: t.Role, name: t.Name, csrf: csrf, expires: now.Add(SessionTTL)}
	if t.Expires.Before(sess.expires) {
		sess.expires = t.Expires
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ended := 0
	if mine := s.byToken[tok]; len(mine) >= s.perToken {
		s.removeLocked(s.oldestLocked(mine))
		ended++
	}
	if s.byRole[t.Role] >= s.perRole {
		ended += s.dropExpiredLocked(now)
	}
	if s.byRole[t.Role] >= s.perRole {
		s.removeLocked(s.oldestOfRoleLocked(t.Role))
		ended++
	}
	k := sha256.Sum256([]byte(id))
	s.m[k] = &entry{session: sess, token: tok, used: now}
	s.byToken[tok] = append(s.byToken[tok], k)
	s.byRole[t.Role]++
	return id, sess, ended, nil
}

// oldestLocked is the least recently used of keys (not empty).
func (s *sessions) oldestLocked(keys [][32]byte) [32]byte {
	old := keys[0]
	for _, k := range keys[1:] {
		if s.m[k].used.Before(s.m[old].used) {
			old = k
		}
	}
	return old
}

// oldestOfRoleLocked is the least recently used session of role, which has one.
func (s *sessions) oldestOfRoleLocked(role trust.Role) [32]byte {
	var old [32]byte
	var at time.Time
	for k, e := range s.m {
		if e.role == role && (at.IsZero() || e.used.Before(at)) {
			old, at = k, e.used
		}
	}
	return old
}

// dropExpiredLocked ends the sessions that have expired at now and says how many.
func (s *sessions) dropExpiredLocked(now time.Time) int {
	n := 0
	for k, e := range s.m {
		if !now.Before(e.expires) {
			s.removeLocked(k)
			n++
		}
	}
	return n
}

// removeLocked ends one session, taking it out of its token's and its role's index.
func (s *sessions) removeLocked(k [32]byte) {
	e, ok := s.m[k]
	if !ok {
		return
	}
	delete(s.m, k)
	if s.byRole[e.role]--; s.byRole[e.role] == 0 {
		delete(s.byRole, e.role)
	}
	mine := s.byToken[e.token]
	for i, o := range mine {
		if o == k {
			mine = append(mine[:i], mine[i+1:]...)
			break
		}
	}
	if len(mine) == 0 {
		delete(s.byToken, e.token)
	} else {
		s.byToken[e.token] = mine
	}
}

// get finds the live session of a cookie value and marks it used at now, dropping it if it
// has expired.
func (s *sessions) get(id string, now time.Time) (session, bool) {
	if id == "" || len(id) > 64 {
		return session{}, false
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[k]
	if !ok {
		return session{}, false
	}
	if !now.Before(e.expires) {
		s.removeLocked(k)
		return session{}, false
	}
	if now.After(e.used) {
		e.used = now
	}
	return e.session, true
}

// drop ends a session; idempotent.
func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(sha256.Sum256([]byte(id)))
}

// retire ends every session whose token's key known no longer holds, and says how many.
func (s *sessions) retire(known func(keyID string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, e := range s.m {
		if !known(e.keyID) {
			s.removeLocked(k)
			n++
		}
	}
	return n
}

// count is how many sessions are kept, by role (expired ones included until dropped).
func (s *sessions) count() map[trust.Role]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[trust.Role]int, len(s.byRole))
	for r, n := range s.byRole {
		out[r] = n
	}
	return out
}

// csrfOK compares a request's CSRF token with its session's in constant time.
func (sess session) csrfOK(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}
