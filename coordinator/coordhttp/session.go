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
	// MaxSessions bounds the console's logged-in sessions; past it, and with none expired to
	// drop, a login is refused OVERLOADED.
	MaxSessions = 1024
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

// sessions are the console's logins, by the SHA-256 of their cookie (the cookie itself is
// kept nowhere), at most MaxSessions.
type sessions struct {
	mu sync.Mutex
	m  map[[32]byte]session
}

func newSessions() *sessions { return &sessions{m: map[[32]byte]session{}} }

// randomText is n random bytes in unpadded base64url.
func randomText(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// create starts a session for a verified token and returns its cookie value.
func (s *sessions) create(t Token, now time.Time) (string, session, error) {
	id, err := randomText(32)
	if err != nil {
		return "", session{}, err
	}
	csrf, err := randomText(32)
	if err != nil {
		return "", session{}, err
	}
	sess := session{keyID: t.KeyID, role: t.Role, name: t.Name, csrf: csrf, expires: now.Add(SessionTTL)}
	if t.Expires.Before(sess.expires) {
		sess.expires = t.Expires
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= MaxSessions {
		for k, v := range s.m {
			if !now.Before(v.expires) {
				delete(s.m, k)
			}
		}
	}
	if len(s.m) >= MaxSessions {
		return "", session{}, fmt.Errorf("console: %d sessions are logged in, the most it keeps: %w", MaxSessions, apierr.ErrOverloaded)
	}
	s.m[sha256.Sum256([]byte(id))] = sess
	return id, sess, nil
}

// get finds the live session of a cookie value, dropping it if it has expired.
func (s *sessions) get(id string, now time.Time) (session, bool) {
	if id == "" || len(id) > 64 {
		return session{}, false
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.m[k]
	if ok && !now.Before(sess.expires) {
		delete(s.m, k)
		return session{}, false
	}
	return sess, ok
}

// drop ends a session; idempotent.
func (s *sessions) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, sha256.Sum256([]byte(id)))
}

// len is how many sessions are kept (expired ones included until dropped).
func (s *sessions) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// csrfOK compares a request's CSRF token with its session's in constant time.
func (sess session) csrfOK(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}
