package wanlink_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/quotaworks/quota/internal/wanlink"
)

// echo serves a line echo on loopback until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return lis.Addr().String()
}

func TestLinkDelaysEachWayAndKeepsOrder(t *testing.T) {
	const delay, jitter = 40 * time.Millisecond, 5 * time.Millisecond
	l, err := wanlink.Listen(wanlink.Route{Name: "us>eu", Listen: "127.0.0.1:0", Upstream: echo(t), Delay: delay, Jitter: jitter})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	// A burst of lines written at once comes back whole and in order, after about one round
	// trip (both ways delayed), not one round trip per line.
	start := time.Now()
	const lines = 200
	go func() {
		for i := range lines {
			if _, err := c.Write([]byte(strconv.Itoa(i) + "\n")); err != nil {
				return
			}
		}
	}()
	for i := range lines {
		s, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if s != strconv.Itoa(i)+"\n" {
			t.Fatalf("line %d: got %q: out of order", i, s)
		}
	}
	took := time.Since(start)
	if took < 2*(delay-jitter) || took > 2*(delay+jitter)+time.Second {
		t.Errorf("a burst's round trip took %s, want about %s", took, 2*delay)
	}
	// One line's round trip: both directions delayed.
	start = time.Now()
	if _, err := c.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*(delay-jitter) {
		t.Errorf("round trip %s, want at least %s", rtt, 2*(delay-jitter))
	}
	l.Close()
	l.Close() // idempotent
	if _, err := c.Write([]byte("y\n")); err == nil {
		if _, err := r.ReadString('\n'); err == nil {
			t.Error("the link still forwards after Close")
		}
	}
}

func TestParseRoute(t *testing.T) {
	r, err := wanlink.ParseRoute("us>eu=127.0.0.1:7411=127.0.0.1:7582=40ms=3ms")
	if err != nil {
		t.Fatal(err)
	}
	want := wanlink.Route{Name: "us>eu", Listen: "127.0.0.1:7411", Upstream: "127.0.0.1:7582", Delay: 40 * time.Millisecond, Jitter: 3 * time.Millisecond}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	for _, bad := range []string{"", "a=b", "n=127.0.0.1:1=127.0.0.1:2", "=127.0.0.1:1=127.0.0.1:2=1ms",
		"n=nohost=127.0.0.1:2=1ms", "n=127.0.0.1:1=127.0.0.1:2=-1ms", "n=127.0.0.1:1=127.0.0.1:2=1ms=11s",
		"n=127.0.0.1:1=127.0.0.1:2=soon"} {
		if _, err := wanlink.ParseRoute(bad); !errors.Is(err, wanlink.ErrBadRoute) {
			t.Errorf("ParseRoute(%q): %v, want ErrBadRoute", bad, err)
		}
	}
}
