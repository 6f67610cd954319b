package coordhttp

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/trust"
)

// op is one step of a session table's test: a login of a token (t0, t1, ... by index; key
// "k1" unless given) of a role, a use of the session an earlier login made (use >= 0), or
// the time passing.
type op struct {
	token int
	role  trust.Role
	key   string
	use   int // the index of the login whose session is used; -1 for a login
	wait  time.Duration
}

func login(token int, role trust.Role) op { return op{token: token, role: role, use: -1} }
func loginKey(token int, key string) op {
	return op{token: token, role: trust.Auditor, key: key, use: -1}
}
func use(i int) op            { return op{use: i} }
func wait(d time.Duration) op { return op{use: -2, wait: d} }

// TestSessionTableBounds: the table keeps at most perToken sessions of a token and perRole of
// a role, ending the least recently used of the token, then the expired ones, then the least
// recently used of the role, never another role's; the indexes stay consistent.
func TestSessionTableBounds(t *testing.T) {
	const A, O = trust.Auditor, trust.Operator
	cases := []struct {
		name              string
		perToken, perRole int
		ops               []op
		live              []int // the logins (by their index among the logins) whose sessions live at the end
		ended             []int // sessions each login ended
	}{
		{"a token's logins past its bound end its least recently used", 3, 10,
			[]op{login(0, A), login(0, A), login(0, A), use(0), login(0, A), login(0, A)},
			[]int{0, 3, 4}, []int{0, 0, 0, 1, 1}},
		{"another token of the role is not touched", 2, 10,
			[]op{login(0, A), login(1, A), login(0, A), login(0, A), login(0, A)},
			[]int{1, 3, 4}, []int{0, 0, 0, 1, 1}},
		{"a full role share ends the role's least recently used, not another role's", 3, 4,
			[]op{login(0, O), login(1, A), login(2, A), login(3, A), login(4, A), use(1), login(5, A), login(6, O)},
			[]int{0, 1, 3, 4, 5, 6}, []int{0, 0, 0, 0, 0, 1, 0}},
		{"auditors past their share leave every operator's session and login", 8, 3,
			[]op{login(0, O), login(1, O), login(2, O), login(3, A), login(4, A), login(5, A), login(6, A), login(7, A), login(8, O)},
			[]int{1, 2, 5, 6, 7, 8}, []int{0, 0, 0, 0, 0, 0, 1, 1, 1}},
		{"expired sessions go before a live one is ended", 8, 3,
			[]op{login(0, A), wait(30 * time.Minute), login(1, A), use(0), wait(40 * time.Minute), login(2, A), login(3, A)},
			[]int{1, 2, 3}, []int{0, 0, 0, 1}},
		{"a token's sessions are counted by token, not by name", 1, 10,
			[]op{login(0, A), login(1, A), login(0, A)},
			[]int{1, 2}, []int{0, 0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newSessions(tc.perToken, tc.perRole)
			ids, ended, now := runOps(t, s, tc.ops)
			if fmt.Sprint(ended) != fmt.Sprint(tc.ended) {
				t.Errorf("ended per login %v; want %v", ended, tc.ended)
			}
			var live []int
			for i, id := range ids {
				if _, ok := s.get(id, now); ok {
					live = append(live, i)
				}
			}
			if fmt.Sprint(live) != fmt.Sprint(tc.live) {
				t.Errorf("live logins %v; want %v", live, tc.live)
			}
			checkIndexes(t, s, tc.perToken, tc.perRole)
		})
	}
}

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// runOps runs ops on s, a second apart, and returns each login's cookie and how many
// sessions it ended, and the time of the last. A session lives an hour (its token's).
func runOps(t *testing.T, s *sessions, ops []op) ([]string, []int, time.Time) {
	t.Helper()
	now := start
	var ids []string
	var ended []int
	for _, o := range ops {
		now = now.Add(time.Second + o.wait)
		switch {
		case o.use >= 0:
			if _, ok := s.get(ids[o.use], now); !ok {
				t.Fatalf("login %d's session is gone before its use", o.use)
			}
		case o.use == -1:
			key := o.key
			if key == "" {
				key = "k1"
			}
			tok := Token{KeyID: key, Role: o.role, Name: "same-name", Expires: now.Add(time.Hour)}
			id, _, n, err := s.create(tok, tokenID{byte(o.token)}, now)
			if err != nil {
				t.Fatal(err)
			}
			ids, ended = append(ids, id), append(ended, n)
		}
	}
	return ids, ended, now
}

// checkIndexes: every session is in its token's and its role's index once, and the bounds
// hold.
func checkIndexes(t *testing.T, s *sessions, perToken, perRole int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	byRole := map[trust.Role]int{}
	inToken := 0
	for tok, keys := range s.byToken {
		if len(keys) == 0 || len(keys) > perToken {
			t.Errorf("token %x has %d sessions indexed; want 1 to %d", tok[:2], len(keys), perToken)
		}
		for _, k := range keys {
			e, ok := s.m[k]
			if !ok || e.token != tok {
				t.Errorf("token %x indexes a session it does not have", tok[:2])
				continue
			}
			inToken++
		}
	}
	for _, e := range s.m {
		byRole[e.role]++
	}
	if inToken != len(s.m) || fmt.Sprint(byRole) != fmt.Sprint(s.byRole) {
		t.Errorf("indexes: %d by token, roles %v; the table has %d, roles %v", inToken, s.byRole, len(s.m), byRole)
	}
	for r, n := range s.byRole {
		if n > perRole {
			t.Errorf("%d sessions of role %s; the share is %d", n, r, perRole)
		}
	}
}

// TestSessionTableRetire: retire ends the sessions of the keys that are gone and only those,
// and the indexes follow.
func TestSessionTableRetire(t *testing.T) {
	s := newSessions(4, 10)
	ids, _, now := runOps(t, s, []op{loginKey(0, "old"), loginKey(0, "old"), loginKey(1, "new"), loginKey(2, "old"),
		{token: 3, role: trust.Operator, key: "old", use: -1}})
	if n := s.retire(func(id string) bool { return id == "new" }); n != 4 {
		t.Fatalf("retire ended %d sessions; want the old key's 4", n)
	}
	for i, id := range ids {
		if _, ok := s.get(id, now); ok != (i == 2) {
			t.Errorf("login %d (key %v) live %v after the old key retired", i, map[bool]string{true: "new", false: "old"}[i == 2], ok)
		}
	}
	if c := s.count(); c[trust.Auditor] != 1 || c[trust.Operator] != 0 || len(s.byToken) != 1 {
		t.Fatalf("count %v, %d tokens indexed; want 1 auditor of 1 token", c, len(s.byToken))
	}
	checkIndexes(t, s, 4, 10)
	if n := s.retire(func(string) bool { return true }); n != 0 {
		t.Fatalf("a second retire ended %d", n)
	}
}

// TestSessionBoundsAddUp: the role shares make up the table's bound, one share per login
// role.
func TestSessionBoundsAddUp(t *testing.T) {
	if MaxSessionsPerRole*len(LoginRoles) != MaxSessions || MaxSessionsPerToken > MaxSessionsPerRole {
		t.Fatalf("MaxSessions %d, MaxSessionsPerRole %d × %d roles, MaxSessionsPerToken %d",
			MaxSessions, MaxSessionsPerRole, len(LoginRoles), MaxSessionsPerToken)
	}
}

// TestAddressKey: an IPv4 client is its address, an IPv6 client its /64.
func TestAddressKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1:1234":             "192.0.2.1",
		"[::ffff:192.0.2.1]:80":      "192.0.2.1",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff::1]:443": "2001:db8:1:2::/64",
		"not an address":             "not an address",
		"[fe80::1%eth0]:1":           "fe80::/64",
	} {
		if got := addressKey(in); got != want {
			t.Errorf("addressKey(%q) = %q; want %q", in, got, want)
		}
	}
}

// TestLoginLimitsAreChecked: bad limits are refused, naming the field.
func TestLoginLimitsAreChecked(t *testing.T) {
	ok := DefaultLoginLimits
	for field, mutate := range map[string]func(l *LoginLimits){
		"Limits.PerToken":   func(l *LoginLimits) { l.PerToken.Burst = 0 },
		"Limits.PerAddress": func(l *LoginLimits) { l.PerAddress.Every = 0 },
		"Limits.MaxKeys":    func(l *LoginLimits) { l.MaxKeys = 0 },
	} {
		l := ok
		mutate(&l)
		if _, err := newLoginLimiter(l); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("limits with a bad %s: %v; want an error naming it", field, err)
		}
	}
	if _, err := newLoginLimiter(ok); err != nil {
		t.Fatal(err)
	}
}
