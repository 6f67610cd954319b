package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits of one bench redis-server's life.
const (
	redisStartTimeout = 10 * time.Second // until it answers PING
	redisStopTimeout  = 5 * time.Second  // after SIGTERM, before SIGKILL
	redisStartTries   = 3                // a free port can be taken between the probe and the start
	redisOutputLimit  = 8 << 10          // bytes of its output kept for error messages
)

// liveRedis counts the bench's redis-server processes not yet reaped; a test checks it is
// back to 0 after a run.
var liveRedis atomic.Int64

// redisServer is one redis-server process the bench started on a loopback port, in a
// scratch directory of its own. Its owner calls Close, which stops the process, waits for
// it and removes the directory; Close may be called any number of times.
type redisServer struct {
	addr      string
	dir       string
	cmd       *exec.Cmd
	out       *tailBuffer
	exited    chan struct{} // closed once the process has been reaped
	waitErr   error         // set before exited is closed
	closeOnce sync.Once
	closeErr  error
}

// redisServerPath finds the redis-server binary: path when set, else redis-server on PATH,
// else Debian's /usr/sbin or /usr/bin.
func redisServerPath(path string) (string, error) {
	if path != "" {
		return exec.LookPath(path)
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/sbin/redis-server"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("redis-server not found on PATH or in /usr/bin: install it with scripts/redis-setup.sh (Debian's redis-server)")
}

// redisVersion is the first line of `redis-server --version`.
func redisVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", path, err)
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line, nil
}

// startRedis starts redis-server (binary path) with an append-only file fsynced as fsync
// says ("always" or "everysec"), no snapshots, on a free loopback port, accepting up to
// maxClients connections, and waits until it answers.
func startRedis(ctx context.Context, path, fsync string, maxClients int) (*redisServer, error) {
	var errs []error
	for range redisStartTries {
		s, err := startRedisOnce(ctx, path, fsync, maxClients)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("start redis-server: %w", errors.Join(errs...))
}

func startRedisOnce(ctx context.Context, path, fsync string, maxClients int) (s *redisServer, err error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "quota-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("scratch directory: %w", err)
	}
	s = &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, out: &tailBuffer{limit: redisOutputLimit},
		exited: make(chan struct{})}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	s.cmd = exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", fsync, "--save", "", "--daemonize", "no", "--logfile", "",
		"--loglevel", "warning", "--maxclients", strconv.Itoa(maxClients))
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = childAttrs()
	if err := s.cmd.Start(); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	liveRedis.Add(1)
	go s.reap()
	return s, s.waitReady(ctx)
}

// reap waits for the process; it is the only goroutine a server owns and ends with it.
func (s *redisServer) reap() {
	s.waitErr = s.cmd.Wait()
	liveRedis.Add(-1)
	close(s.exited)
}

// waitReady pings the server until it answers, it exits, or redisStartTimeout passes.
func (s *redisServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, redisStartTimeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 1, MaxRetries: -1, DisableIdentity: true,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
	defer c.Close()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", s.addr) // listening yet? (the client would log each refusal)
		if err == nil {
			_ = conn.Close()
			if err = c.Ping(ctx).Err(); err == nil {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on %s exited (%v): %s", s.addr, s.waitErr, s.out.String())
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s did not answer within %s (%w): %s", s.addr, redisStartTimeout, err, s.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops the server (SIGTERM, then SIGKILL after redisStopTimeout), waits until it has
// exited and removes its directory. It is idempotent and safe after a failed start.
func (s *redisServer) Close() error {
	s.closeOnce.Do(func() {
		if s.cmd != nil && s.cmd.Process != nil {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(redisStopTimeout):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
		if err := os.RemoveAll(s.dir); err != nil {
			s.closeErr = fmt.Errorf("remove %s: %w", s.dir, err)
		}
	})
	return s.closeErr
}

// freePort asks the kernel for a free loopback TCP port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tailBuffer keeps the last limit bytes written to it; safe for concurrent writers.
type tailBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if over := b.buf.Len() - b.limit; over > 0 {
		b.buf.Next(over)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

// cpu is the CPU (user and system) the server process has used so far, from
// /proc/<pid>/stat in 10 ms ticks; ok is false where that cannot be read (not Linux).
func (s *redisServer) cpu() (time.Duration, bool) {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0, false
	}
	return parsePidStat(string(b))
}

// parsePidStat reads utime and stime (fields 14 and 15) of a /proc/<pid>/stat line. The
// command name (field 2) is in parentheses and may hold spaces, so fields are counted after
// its closing parenthesis.
func parsePidStat(text string) (time.Duration, bool) {
	i := strings.LastIndexByte(text, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(text[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || u < 0 || st < 0 {
		return 0, false
	}
	return time.Duration(u+st) * (time.Second / userHZ), true
}
