package stack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultStopGrace is how long Stop waits after SIGTERM before SIGKILL.
const DefaultStopGrace = 5 * time.Second

// SpawnerFunction names the one goroutine this package leaves running for the
// life of the process (it owns the OS thread every child is forked from).
// Tests that use goleak pass goleak.IgnoreTopFunction(stack.SpawnerFunction).
const SpawnerFunction = "github.com/fleetsync/fleetsync/test/stack.spawnLoop"

// Process is a child process whose stdout and stderr go to LogPath. It runs in
// its own process group and is SIGKILLed by the kernel if the test process
// dies; Stop or Kill ends it (and anything it started in its group).
type Process struct {
	Name    string   // short name used in errors and log file names
	Bin     string   // path of the binary
	Args    []string // arguments, without the binary
	Dir     string   // working directory; the log file lives here too
	LogPath string   // stdout and stderr of the child

	cmd     *exec.Cmd
	ownsDir bool
	done    chan struct{}
	exitErr error // valid once done is closed

	stopOnce sync.Once
	stopErr  error
	tailMu   sync.Mutex
	tail     string // log tail cached before an owned dir is removed
}

// StartProcess starts bin with args as a child named name. env is added to the
// test process's environment (later entries win). dir is the working
// directory and where "<name>.log" is written (truncated); when dir is "" a
// temp dir is made and removed again by Stop or Kill. ctx only bounds the
// start: the child lives until Stop or Kill, or until the test process dies.
// StartProcess does not wait for readiness; that is the caller's signal.
func StartProcess(ctx context.Context, name, bin string, args []string, env []string, dir string) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Bin: bin, Args: append([]string(nil), args...), Dir: dir, done: make(chan struct{})}
	if p.Dir == "" {
		d, err := makeTempDir(sanitize(name))
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", name, err)
		}
		p.Dir, p.ownsDir = d, true
	}
	p.LogPath = filepath.Join(p.Dir, sanitize(name)+".log")
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		p.removeDir()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close() // the child has its own copy after Start

	cmd := exec.Command(bin, args...)
	cmd.Dir = p.Dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf // *os.File: no copying goroutines
	cmd.SysProcAttr = sysProcAttr()
	if err := spawn(cmd); err != nil {
		p.removeDir()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p.cmd = cmd
	go func() {
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the child's process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the child has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Wait waits for the child to exit and returns its exit error (nil on exit
// status 0; an *exec.ExitError otherwise, also when it was killed by Stop).
func (p *Process) Wait() error {
	<-p.done
	return p.exitErr
}

// Signal sends sig to the child's whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	if p.Exited() {
		return nil
	}
	if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling %s: %w", p.Name, err)
	}
	return nil
}

// Stop ends the child gracefully: SIGTERM to its process group, up to
// DefaultStopGrace to exit, then SIGKILL; it waits for the exit. It returns
// an error only if the child could not be ended; how it exited is Wait's.
// Stop is idempotent and safe after Kill.
func (p *Process) Stop() error { return p.StopTimeout(DefaultStopGrace) }

// StopTimeout is Stop with a chosen grace period (0 means SIGKILL at once).
func (p *Process) StopTimeout(grace time.Duration) error {
	p.stopOnce.Do(func() { p.stopErr = p.terminate(grace) })
	return p.stopErr
}

// Kill SIGKILLs the child's process group and waits for the exit, like a
// crash: no graceful shutdown.
func (p *Process) Kill() error { return p.StopTimeout(0) }

func (p *Process) terminate(grace time.Duration) error {
	defer p.removeDir()
	if grace > 0 {
		if err := p.Signal(syscall.SIGTERM); err != nil {
			return err
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.done:
			return nil
		case <-t.C:
		}
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(30 * time.Second): // SIGKILL cannot be ignored; a D-state child can
		return fmt.Errorf("%s (pid %d) did not exit 30s after SIGKILL", p.Name, p.Pid())
	}
}

func (p *Process) removeDir() {
	if !p.ownsDir {
		return
	}
	p.cacheTail()
	_ = os.RemoveAll(p.Dir)
}

// cacheTail keeps the log's last lines in memory, for LogTail after the log
// file is removed.
func (p *Process) cacheTail() {
	tail := p.readTail(100)
	p.tailMu.Lock()
	p.tail = tail
	p.tailMu.Unlock()
}

// LogTail returns the last n lines of the child's log (what it printed).
func (p *Process) LogTail(n int) string {
	p.tailMu.Lock()
	cached := p.tail
	p.tailMu.Unlock()
	if cached != "" {
		return lastLines(cached, n)
	}
	return p.readTail(n)
}

func (p *Process) readTail(n int) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return lastLines(string(b), n)
}

// describe is a one-paragraph account of a child that failed to come up.
func (p *Process) describe() string {
	state := "still running"
	if p.Exited() {
		state = fmt.Sprintf("exited: %v", p.exitErr)
	}
	return fmt.Sprintf("%s (pid %d, %s); log %s, last lines:\n%s", p.Name, p.Pid(), state, p.LogPath, indent(p.LogTail(30)))
}

func lastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func indent(s string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(s, "\n") {
		b.WriteString("    | ")
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.String()
}

func sanitize(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, name)
}

// The spawner: every child is forked from one goroutine locked to its OS
// thread forever. Linux delivers Pdeathsig when the thread that forked the
// child exits, not the process; Go ends a thread when a goroutine exits while
// locked to it, so forking from an arbitrary thread could kill a child early.

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go spawnLoop(spawnCh)
	})
	req := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- req
	return <-req.err
}

func spawnLoop(reqs <-chan spawnReq) {
	runtime.LockOSThread() // never unlocked: the thread lives as long as the process
	for r := range reqs {
		r.err <- r.cmd.Start()
	}
}
