package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
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

// consulProbe is what the server tests write and look for again: a KV key
// and a catalog registration.
type consulProbe struct {
	t *testing.T
	c *consulapi.Client
}

func (p consulProbe) register(node string) {
	p.t.Helper()
	reg := &consulapi.CatalogRegistration{Node: node, Address: "127.0.0.1", Service: &consulapi.AgentService{ID: "web-" + node, Service: "web", Port: 80}}
	if _, err := p.c.Catalog().Register(reg, nil); err != nil {
		p.t.Fatalf("registering %s: %v", node, err)
	}
}

func (p consulProbe) deregister(node string) {
	p.t.Helper()
	if _, err := p.c.Catalog().Deregister(&consulapi.CatalogDeregistration{Node: node}, nil); err != nil {
		p.t.Fatalf("deregistering %s: %v", node, err)
	}
}

func (p consulProbe) put(key, value string) {
	p.t.Helper()
	if _, err := p.c.KV().Put(&consulapi.KVPair{Key: key, Value: []byte(value)}, nil); err != nil {
		p.t.Fatalf("putting %s: %v", key, err)
	}
}

// get is the key's value, "" when there is none.
func (p consulProbe) get(key string) string {
	p.t.Helper()
	kv, _, err := p.c.KV().Get(key, nil)
	if err != nil {
		p.t.Fatalf("getting %s: %v", key, err)
	}
	if kv == nil {
		return ""
	}
	return string(kv.Value)
}

// web is the sorted nodes of the web instances, and the catalog's index.
func (p consulProbe) web() (string, uint64) {
	p.t.Helper()
	svcs, meta, err := p.c.Catalog().Service("web", "", nil)
	if err != nil {
		p.t.Fatalf("reading web: %v", err)
	}
	nodes := make([]string, len(svcs))
	for i, s := range svcs {
		nodes[i] = s.Node
	}
	slices.Sort(nodes)
	return strings.Join(nodes, ","), meta.LastIndex
}

// nodesIndex is X-Consul-Index of /v1/catalog/nodes.
func (p consulProbe) nodesIndex() uint64 {
	p.t.Helper()
	_, meta, err := p.c.Catalog().Nodes(nil)
	if err != nil {
		p.t.Fatal(err)
	}
	return meta.LastIndex
}

// raftIndex is the agent's last Raft log index (/v1/agent/self).
func (p consulProbe) raftIndex() uint64 {
	p.t.Helper()
	self, err := p.c.Agent().Self()
	if err != nil {
		p.t.Fatal(err)
	}
	raft, _ := self["Stats"]["raft"].(map[string]any)
	s, _ := raft["last_log_index"].(string)
	i, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		p.t.Fatalf("/v1/agent/self Stats.raft.last_log_index = %v: %v", raft["last_log_index"], err)
	}
	return i
}

func timed(t *testing.T, what string, f func() error) {
	t.Helper()
	start := time.Now()
	if err := f(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s took %s", what, time.Since(start).Round(time.Millisecond))
}

// TestConsulServerKeepsData: a single server keeps a KV key and a catalog
// registration across a crash (Restart: kill -9) and a graceful restart,
// on the same address; RestartEmpty loses them.
func TestConsulServerKeepsData(t *testing.T) {
	c := ConsulOptionsT(t, ConsulOptions{Servers: 1})
	ctx := context.Background()
	p := consulProbe{t, c.Client}
	if n := len(c.Servers()); n != 1 || c.Server(0).DataDir == "" || c.Server(0).Client != c.Client {
		t.Fatalf("%d servers, data dir %q", n, c.Server(0).DataDir)
	}
	before, err := c.RaftApplies()
	if err != nil {
		t.Fatal(err)
	}
	p.put("fleetsync-test/probe", "v1")
	p.register("synthetic")
	if after, err := c.RaftApplies(); err != nil || after < before+2 {
		t.Fatalf("RaftApplies %v -> %v, %v across two writes", before, after, err)
	}

	addr, pid := c.Addr, c.Agent().Pid()
	timed(t, "Restart (kill -9, data kept)", func() error { return c.Restart(ctx) })
	timed(t, "RestartServer (SIGTERM, data kept)", func() error { return c.RestartServer(ctx, 0) })
	if c.Addr != addr || c.Agent().Pid() == pid || alive(pid) {
		t.Fatalf("restarts: addr %s -> %s, pid %d -> %d", addr, c.Addr, pid, c.Agent().Pid())
	}
	if v := p.get("fleetsync-test/probe"); v != "v1" {
		t.Fatalf("KV after restarts = %q; want v1", v)
	}
	if web, _ := p.web(); web != "synthetic" {
		t.Fatalf("web after restarts on %q; want synthetic", web)
	}
	p.put("fleetsync-test/probe", "v2") // the same Client writes

	timed(t, "RestartEmpty", func() error { return c.RestartEmpty(ctx) })
	if v := p.get("fleetsync-test/probe"); v != "" {
		t.Fatalf("KV after RestartEmpty = %q; want none", v)
	}
	if web, _ := p.web(); web != "" {
		t.Fatalf("web after RestartEmpty on %q; want none", web)
	}
	if i := p.raftIndex(); i > 100 {
		t.Fatalf("Raft index %d after RestartEmpty; want a new log", i)
	}
	p.register("synthetic")

	if err := c.StopServer(0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.Status().Leader(); err == nil {
		t.Fatal("StopServer: the server still answers")
	}
	if err := c.StartServer(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if web, _ := p.web(); web != "synthetic" {
		t.Fatalf("web after StopServer/StartServer on %q; want synthetic", web)
	}
	if err := c.StartServer(ctx, 0); err == nil {
		t.Fatal("StartServer of a running server: want an error")
	}
}

// TestConsulSnapshotRestore: a restore drops what was written after the
// snapshot and brings back what was deleted since, on the dev agent and on a
// server. It pins what a detector of restores can rely on (Consul 1.14):
// the Raft index goes on; the X-Consul-Index of restored data goes back,
// until the next write to it, which lands past every old index.
func TestConsulSnapshotRestore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		servers int
	}{{"dev", 0}, {"server", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			c := ConsulOptionsT(t, ConsulOptions{Servers: tc.servers})
			ctx := context.Background()
			p := consulProbe{t, c.Client}
			if l, err := c.Leader(ctx); err != nil || l != 0 {
				t.Fatalf("Leader = %d, %v", l, err)
			}
			p.register("kept")
			p.register("deleted-later")
			p.put("k", "v1")
			var snap []byte
			timed(t, "SnapshotSave", func() (err error) { snap, err = c.SnapshotSave(ctx); return err })
			p.register("added-later")
			p.deregister("deleted-later")
			p.put("k", "v2")
			if web, _ := p.web(); web != "added-later,kept" {
				t.Fatalf("web before the restore on %q", web)
			}
			_, webBefore := p.web()
			nodesBefore, raftBefore := p.nodesIndex(), p.raftIndex()

			timed(t, fmt.Sprintf("SnapshotRestore (%d bytes)", len(snap)), func() error { return c.SnapshotRestore(ctx, snap) })
			web, webAfter := p.web()
			if web != "deleted-later,kept" {
				t.Fatalf("web after the restore on %q; want deleted-later,kept", web)
			}
			if v := p.get("k"); v != "v1" {
				t.Fatalf("KV after the restore = %q; want v1", v)
			}
			nodesAfter, raftAfter := p.nodesIndex(), p.raftIndex()
			// Only the test writes web. /v1/catalog/nodes goes back too,
			// but the agent's anti-entropy may rewrite its own node right
			// after the restore, at a new Raft index past the old ones.
			t.Logf("X-Consul-Index of /v1/catalog/service/web %d -> %d, of /v1/catalog/nodes %d -> %d; Raft last index %d -> %d",
				webBefore, webAfter, nodesBefore, nodesAfter, raftBefore, raftAfter)
			if webAfter >= webBefore {
				t.Errorf("X-Consul-Index of /v1/catalog/service/web %d -> %d across the restore; Consul 1.14 sends it back", webBefore, webAfter)
			}
			if raftAfter <= raftBefore {
				t.Errorf("Raft index %d -> %d across the restore; want it to go on", raftBefore, raftAfter)
			}
			p.register("after-restore")
			if _, idx := p.web(); idx <= raftBefore {
				t.Errorf("the first write after the restore has index %d, not past the old Raft index %d", idx, raftBefore)
			}
		})
	}
}

// TestConsulRestoreWakesBlockingQueryWithOldData pins the trap for a
// watcher: a blocking catalog query in flight during a restore returns at
// once, but with the abandoned store's data and its index unchanged. Only
// the next read sees the restored data, with a lower index.
func TestConsulRestoreWakesBlockingQueryWithOldData(t *testing.T) {
	c := ConsulOptionsT(t, ConsulOptions{Servers: 1})
	ctx := context.Background()
	p := consulProbe{t, c.Client}
	p.register("kept")
	snap, err := c.SnapshotSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.register("added-later")
	_, idx := p.web()
	blocking, err := c.Counter("consul_rpc_queries_blocking")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		web string
		idx uint64
		err error
	}
	res := make(chan result, 1)
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	go func() {
		svcs, meta, err := c.Client.Catalog().Service("web", "", (&consulapi.QueryOptions{WaitIndex: idx, WaitTime: time.Minute}).WithContext(qctx))
		r := result{err: err}
		if err == nil {
			var nodes []string
			for _, s := range svcs {
				nodes = append(nodes, s.Node)
			}
			slices.Sort(nodes)
			r.web, r.idx = strings.Join(nodes, ","), meta.LastIndex
		}
		res <- r
	}()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := waitFor(wctx, "the blocking query to block", nil, func(context.Context) (bool, error) {
		n, err := c.Counter("consul_rpc_queries_blocking")
		return err == nil && n > blocking, fmt.Errorf("consul_rpc_queries_blocking = %v, was %v: %v", n, blocking, err)
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.SnapshotRestore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	r := <-res
	t.Logf("the blocking query (WaitIndex %d) returned after %s: index %d, web on %q", idx, time.Since(start).Round(time.Millisecond), r.idx, r.web)
	if r.err != nil || r.idx != idx || r.web != "added-later,kept" {
		t.Fatalf("blocking query across the restore = %q at %d, %v; want the old data at the old index %d", r.web, r.idx, r.err, idx)
	}
	if web, now := p.web(); web != "kept" || now >= idx {
		t.Fatalf("the next read = %q at %d; want the restored data at an index below %d", web, now, idx)
	}
}

// TestConsulCluster: three servers elect a leader; kill -9 of the leader
// leaves a new one that takes writes; the killed server rejoins and reads
// them.
func TestConsulCluster(t *testing.T) {
	c := ConsulOptionsT(t, ConsulOptions{Servers: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	servers := c.Servers()
	if len(servers) != 3 {
		t.Fatalf("%d servers", len(servers))
	}
	names := map[string]bool{}
	for _, s := range servers {
		names[s.NodeName] = true
		if s.DataDir == "" || !s.Running() {
			t.Fatalf("server %d: data dir %q, running %v", s.Index, s.DataDir, s.Running())
		}
	}
	if len(names) != 3 {
		t.Fatalf("node names %v; want three", names)
	}
	voters := func(via int) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			cfg, err := c.ServerClient(via).Operator().RaftGetConfiguration(nil)
			if err != nil {
				return false, err
			}
			n := 0
			for _, s := range cfg.Servers {
				if s.Voter && names[s.Node] {
					n++
				}
			}
			return n == 3, fmt.Errorf("%d of 3 servers are voters: %+v", n, cfg.Servers)
		}
	}
	if err := waitFor(ctx, "three voters", nil, voters(0)); err != nil {
		t.Fatal(err)
	}
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}

	var leader int
	timed(t, fmt.Sprintf("kill -9 of leader %d until a new leader", old), func() (err error) {
		if err := c.KillServer(old); err != nil {
			return err
		}
		leader, err = c.Leader(ctx)
		return err
	})
	if leader == old {
		t.Fatalf("leader %d after its kill", leader)
	}
	other := 3 - old - leader // the follower that stayed
	consulProbe{t, c.ServerClient(other)}.put("after-failover", "yes")

	timed(t, fmt.Sprintf("StartServer(%d) after kill -9", old), func() error { return c.StartServer(ctx, old) })
	if l, err := c.Leader(ctx); err != nil || l != leader {
		t.Fatalf("Leader after the rejoin = %d, %v; want %d", l, err, leader)
	}
	if v := (consulProbe{t, c.ServerClient(old)}).get("after-failover"); v != "yes" {
		t.Fatalf("the rejoined server reads %q", v)
	}
	if err := waitFor(ctx, "three voters after the rejoin", nil, voters(old)); err != nil {
		t.Fatal(err)
	}

	timed(t, fmt.Sprintf("RestartServer(%d), a follower", other), func() error { return c.RestartServer(ctx, other) })
	consulProbe{t, c.ServerClient(other)}.put("after-restart", "yes")
	timed(t, "Restart of all three (kill -9, data kept)", func() error { return c.Restart(ctx) })
	if v := (consulProbe{t, c.Client}).get("after-restart"); v != "yes" {
		t.Fatalf("after restarting all three: %q", v)
	}
}

// TestSlowMetricsAreReadAgain: a metrics read that times out is tried
// again; an agent that answers the second time is read.
func TestSlowMetricsAreReadAgain(t *testing.T) {
	defer func(try time.Duration) { metricsTry = try }(metricsTry)
	metricsTry = 200 * time.Millisecond
	var calls atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			select { // the first read outlives its deadline
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		_, _ = w.Write([]byte(RaftApplyMetric + " 7\n"))
	}))
	defer srv.Close()
	defer close(release)
	c := &Consul{HTTPAddr: srv.URL, http: srv.Client()}
	if v, err := c.RaftApplies(); err != nil || v != 7 || calls.Load() != 2 {
		t.Fatalf("RaftApplies = %v, %v after %d reads; want 7 after 2", v, err, calls.Load())
	}
}
