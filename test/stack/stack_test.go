package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

func TestParsePromCounter(t *testing.T) {
	const text = `# HELP consul_raft_apply This counts the number of Raft transactions occurring over the interval.
# TYPE consul_raft_apply counter
consul_raft_apply 12
# TYPE consul_raft_apply_time summary
consul_raft_apply_time{quantile="0.5"} 3.5
consul_raft_applied_index 40
consul_raft_apply{shard="b"} 3 1700000000000
`
	v, found, err := parsePromCounter(bufio.NewScanner(strings.NewReader(text)), RaftApplyMetric)
	if err != nil || !found || v != 15 {
		t.Fatalf("parsePromCounter = %v, %v, %v; want 15, true, nil", v, found, err)
	}
	_, found, err = parsePromCounter(bufio.NewScanner(strings.NewReader("other 1\n")), RaftApplyMetric)
	if err != nil || found {
		t.Fatalf("absent metric: found=%v err=%v", found, err)
	}
	if _, _, err := parsePromCounter(bufio.NewScanner(strings.NewReader("consul_raft_apply x\n")), RaftApplyMetric); err == nil {
		t.Fatal("malformed value: want an error")
	}
}

func TestBinDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("FLEETSYNC_TOOLS_BIN", dir)
	_, err := BinDir()
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("BinDir with an empty dir: %v; want an error saying `make tools`", err)
	}
	for _, n := range []string{EtcdBin, APIServerBin, ConsulBin} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := BinDir(); err != nil || got != dir {
		t.Fatalf("BinDir = %q, %v; want %q", got, err, dir)
	}

	t.Setenv("FLEETSYNC_TOOLS_BIN", "")
	t.Setenv("FLEETSYNC_TOOLS_CACHE", "/nonexistent/cache")
	if got, _ := binDirPath(); got != "/nonexistent/cache/bin" {
		t.Fatalf("binDirPath with FLEETSYNC_TOOLS_CACHE = %q", got)
	}
	t.Setenv("FLEETSYNC_TOOLS_CACHE", "")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	if got, _ := binDirPath(); got != "/xdg/fleetsync-tools/bin" {
		t.Fatalf("binDirPath with XDG_CACHE_HOME = %q", got)
	}
}

func TestSweepStaleDirs(t *testing.T) {
	live, err := makeTempDir("sweep-live")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(live)
	// A dir owned by a process that is gone: our own pid with another start
	// time stands for a reused pid.
	dead, err := makeTempDir("sweep-dead")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dead)
	if err := os.WriteFile(filepath.Join(dead, ownerFile), []byte(fmt.Sprintf("%d 1\n", os.Getpid())), 0o644); err != nil {
		t.Fatal(err)
	}
	unmarked, err := os.MkdirTemp("", tempPrefix+"sweep-unmarked-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(unmarked)

	if err := SweepStaleDirs(); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]bool{live: true, dead: false, unmarked: true} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("after the sweep, %s exists=%v; want %v", dir, err == nil, want)
		}
	}
}

func TestProcessLogAndExit(t *testing.T) {
	dir := t.TempDir()
	p, err := StartProcess(context.Background(), "echo", "/bin/sh", []string{"-c", `echo "hello $GREETING"; echo oops >&2; exit 3`}, []string{"GREETING=world"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("Wait = %v; want exit status 3", err)
	}
	if got := p.LogTail(10); got != "hello world\noops" {
		t.Fatalf("LogTail = %q", got)
	}
	if p.LogPath != filepath.Join(dir, "echo.log") {
		t.Fatalf("LogPath = %q", p.LogPath)
	}
	if err := p.Stop(); err != nil { // after exit: a no-op
		t.Fatal(err)
	}
}

func TestProcessStopEscalatesToSIGKILL(t *testing.T) {
	// The shell ignores SIGTERM and so does its child (in the same group).
	p, err := StartProcess(context.Background(), "stubborn", "/bin/sh", []string{"-c", `trap "" TERM; echo ready; sleep 300 & wait`}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, p, "ready")
	start := time.Now()
	if err := p.StopTimeout(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 10*time.Second {
		t.Fatalf("Stop took %s; want the grace period, then SIGKILL", d)
	}
	var ee *exec.ExitError
	if err := p.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait = %v; want killed by SIGKILL", err)
	}
	if _, err := os.Stat(p.Dir); !os.IsNotExist(err) {
		t.Fatalf("owned dir %s not removed: %v", p.Dir, err)
	}
	if got := p.LogTail(5); got != "ready" {
		t.Fatalf("LogTail after the dir is gone = %q", got)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
}

// helperEnv makes this test binary act as a "test process" that starts
// children and reports their pids, for the death tests below.
const helperEnv = "FLEETSYNC_STACK_HELPER"

// TestHelperProcess is not a test: it is the child of the death tests.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("helper for the death tests")
	}
	ctx := context.Background()
	var pids []int
	var dirs []string
	switch mode {
	case "sleep":
		p, err := StartProcess(ctx, "sleep", "/bin/sleep", []string{"300"}, nil, "")
		if err != nil {
			fmt.Println("ERROR", err)
			os.Exit(1)
		}
		pids, dirs = append(pids, p.Pid()), append(dirs, p.Dir)
	case "servers":
		k, err := StartKube(ctx, KubeOptions{})
		if err != nil {
			fmt.Println("ERROR", strings.ReplaceAll(err.Error(), "\n", " | "))
			os.Exit(1)
		}
		c, err := StartConsul(ctx, ConsulOptions{})
		if err != nil {
			fmt.Println("ERROR", strings.ReplaceAll(err.Error(), "\n", " | "))
			os.Exit(1)
		}
		pids = append(pids, k.Etcd.Pid(), k.APIServer.Pid(), c.Agent().Pid())
		dirs = append(dirs, k.Dir, c.Dir)
	}
	fmt.Println("PIDS", strings.Trim(fmt.Sprint(pids), "[]"), "DIRS", strings.Join(dirs, " "))
	select {} // until killed; never stops its children
}

// runHelper starts this test binary as a helper in the given mode, reads the
// pids and temp dirs of the children it started, SIGKILLs it (no cleanup of
// any kind runs) and returns them.
func runHelper(t *testing.T, mode string, timeout time.Duration) (pids []int, dirs []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "PIDS ") || strings.HasPrefix(l, "ERROR ") {
				lines <- l
				break
			}
		}
		close(lines)
		for sc.Scan() { // drain
		}
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(timeout):
		t.Fatalf("helper %s reported no pids in %s", mode, timeout)
	}
	if !strings.HasPrefix(line, "PIDS ") {
		t.Fatalf("helper %s: %q", mode, line)
	}
	pidList, dirList, _ := strings.Cut(strings.TrimPrefix(line, "PIDS "), " DIRS ")
	dirs = strings.Fields(dirList)
	for _, f := range strings.Fields(pidList) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		if !alive(pid) {
			t.Fatalf("child %d is not running before the helper dies", pid)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return pids, dirs
}

// alive: the pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndex(s, ")")
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

// waitDead checks that the children of a killed test process die, and that
// its temp dirs, left behind, are swept.
func waitDead(t *testing.T, pids []int, dirs []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("child %d still running 10s after the test process died", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, ownerFile)); err != nil {
			t.Fatalf("temp dir %s of the killed helper: %v", d, err)
		}
	}
	if err := SweepStaleDirs(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("SweepStaleDirs left %s of the dead helper: %v", d, err)
		}
	}
}

func TestChildDiesWithTestProcess(t *testing.T) {
	pids, dirs := runHelper(t, "sleep", 30*time.Second)
	waitDead(t, pids, dirs)
}

func TestServersDieWithTestProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real servers; skipped under -short")
	}
	if _, err := BinDir(); err != nil {
		t.Fatal(err)
	}
	pids, dirs := runHelper(t, "servers", 3*time.Minute)
	waitDead(t, pids, dirs)
}

func waitLog(t *testing.T, p *Process, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.LogTail(20), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never logged %q; log: %q", p.Name, want, p.LogTail(20))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKube(t *testing.T) {
	k := KubeT(t)
	if !strings.HasPrefix(k.Version, "v1.") {
		t.Fatalf("Version = %q", k.Version)
	}
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}, Data: map[string]string{"a": "b"}}
	if _, err := k.Client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The kubeconfig names the same server and credentials.
	b, err := os.ReadFile(k.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	var kc struct {
		Clusters []struct {
			Cluster struct {
				Server string `json:"server"`
				CA     []byte `json:"certificate-authority-data"`
			} `json:"cluster"`
		} `json:"clusters"`
		Users []struct {
			User struct {
				Token string `json:"token"`
			} `json:"user"`
		} `json:"users"`
		CurrentContext string `json:"current-context"`
	}
	if err := yaml.Unmarshal(b, &kc); err != nil {
		t.Fatal(err)
	}
	if len(kc.Clusters) != 1 || kc.Clusters[0].Cluster.Server != k.URL || string(kc.Clusters[0].Cluster.CA) != string(k.CAPEM) ||
		len(kc.Users) != 1 || kc.Users[0].User.Token != k.AdminToken || kc.CurrentContext == "" {
		t.Fatalf("kubeconfig does not match the stack:\n%s", b)
	}

	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(k.Dir); !os.IsNotExist(err) {
		t.Fatalf("Stop left %s behind", k.Dir)
	}
	for _, p := range []*Process{k.Etcd, k.APIServer} {
		if !p.Exited() || alive(p.Pid()) {
			t.Fatalf("%s still running after Stop", p.Name)
		}
	}
}

func TestConsulRestart(t *testing.T) {
	c := ConsulT(t)
	if !strings.HasPrefix(c.Version, "1.") {
		t.Fatalf("Version = %q", c.Version)
	}
	before, err := c.RaftApplies()
	if err != nil {
		t.Fatal(err)
	}
	if before < 1 {
		t.Fatalf("RaftApplies = %v after start; the agent registers itself, so want >= 1", before)
	}
	reg := &consulapi.CatalogRegistration{Node: "synthetic", Address: "127.0.0.1", Service: &consulapi.AgentService{ID: "web-1", Service: "web", Port: 80}}
	if _, err := c.Client.Catalog().Register(reg, nil); err != nil {
		t.Fatal(err)
	}
	after, err := c.RaftApplies()
	if err != nil {
		t.Fatal(err)
	}
	if after < before+1 {
		t.Fatalf("RaftApplies %v -> %v across one catalog register", before, after)
	}

	oldPid, addr := c.Agent().Pid(), c.Addr
	if err := c.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.Addr != addr || c.Agent().Pid() == oldPid || alive(oldPid) {
		t.Fatalf("Restart: addr %s -> %s, pid %d -> %d (old alive %v)", addr, c.Addr, oldPid, c.Agent().Pid(), alive(oldPid))
	}
	svcs, _, err := c.Client.Catalog().Service("web", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 0 {
		t.Fatalf("after Restart the catalog still has %d web instances; want a fresh, empty agent", len(svcs))
	}
	if _, err := c.Client.Catalog().Register(reg, nil); err != nil {
		t.Fatalf("the same Client after Restart: %v", err)
	}

	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Status().Leader(); err == nil {
		t.Fatal("Kill: the agent still answers")
	}
}
