package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100
// on every Linux architecture Go supports).
const userHZ = 100

// cpuSeconds returns the user + system CPU time a process has used, from
// /proc/<pid>/stat (fields 14 and 15).
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	utime, err1 := strconv.ParseFloat(f[11], 64)
	stime, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: malformed times", pid)
	}
	return (utime + stime) / userHZ, nil
}

// memStatus returns VmRSS and VmHWM (peak RSS) of a process, in bytes, from
// /proc/<pid>/status.
func memStatus(pid int) (rss, hwm float64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "VmRSS:":
			rss = kb * 1024
		case "VmHWM:":
			hwm = kb * 1024
		}
	}
	if rss == 0 {
		return 0, 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return rss, hwm, sc.Err()
}

// seriesCount is the key under which scrape returns the number of samples
// (series) the exposition held.
const seriesCount = "#series"

// scrape fetches a daemon's /metrics and returns the samples of the named
// metrics (summed over label sets) and the number of series (seriesCount),
// the body size and how long it took.
func scrape(ctx context.Context, base string, names ...string) (map[string]float64, int, time.Duration, error) {
	return scrapeURL(ctx, base+"/metrics", names...)
}

// scrapeURL is scrape for any Prometheus text endpoint.
func scrapeURL(ctx context.Context, url string, names ...string) (map[string]float64, int, time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	resp, err := get(ctx, url)
	if err != nil {
		return nil, 0, 0, err
	}
	defer resp.Body.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{seriesCount: 0}
	cr := &countingReader{r: resp.Body}
	sc := bufio.NewScanner(cr)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		out[seriesCount]++
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		// No timestamps in these expositions: the value is the last field.
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, 0, 0, err
	}
	return out, cr.n, time.Since(start), nil
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

const mib = 1 << 20

// consulWrites is Consul's count of Raft applies, in all and by kind (from
// its FSM timers): catalog transactions (/v1/txn, what fleetsync's writes
// are), sessions and KV (fleetsync's cluster-id claim), and the FSM time
// spent applying transactions.
type consulWrites struct {
	total, txn, session, kvs float64
	txnMillis                float64
}

func (b *bench) consulWrites() (consulWrites, error) {
	m, _, _, err := scrapeURL(b.ctx, b.consul.HTTPAddr+"/v1/agent/metrics?format=prometheus",
		"consul_raft_apply", "consul_fsm_txn_count", "consul_fsm_txn_sum", "consul_fsm_session_count", "consul_fsm_kvs_count")
	if err != nil {
		return consulWrites{}, err
	}
	return consulWrites{total: m["consul_raft_apply"], txn: m["consul_fsm_txn_count"], session: m["consul_fsm_session_count"],
		kvs: m["consul_fsm_kvs_count"], txnMillis: m["consul_fsm_txn_sum"]}, nil
}

func (w consulWrites) minus(o consulWrites) consulWrites {
	return consulWrites{total: w.total - o.total, txn: w.txn - o.txn, session: w.session - o.session,
		kvs: w.kvs - o.kvs, txnMillis: w.txnMillis - o.txnMillis}
}

// breakdown says what the applies were.
func (w consulWrites) breakdown() string {
	s := fmt.Sprintf("%.0f catalog transactions", w.txn)
	if w.session+w.kvs > 0 {
		s += fmt.Sprintf(" + %.0f session/KV (cluster-id claim)", w.session+w.kvs)
	}
	if other := w.total - w.txn - w.session - w.kvs; other != 0 {
		s += fmt.Sprintf(" + %.0f other", other)
	}
	return s
}

// cpuProfile saves, with --pprof, a CPU profile of the daemon's next secs
// seconds to <out>/cpu-<name>.pb.gz, in the background: it asks as soon as
// the daemon's HTTP listener answers. wait returns once it is saved.
func (b *bench) cpuProfile(d *fixture.Daemon, name string, secs int) (wait func()) {
	return b.profile(d.HTTP, "cpu-"+name, secs)
}

// consulProfile is cpuProfile for Consul (server 0, started with
// enable_debug under --pprof): <out>/consul-cpu-<name>.pb.gz, the profile
// that shows what Consul spends its CPU on while fleetsync waits for it.
func (b *bench) consulProfile(name string, secs int) (wait func()) {
	return b.profile(b.consul.HTTPAddr, "consul-cpu-"+name, secs)
}

// profile saves base's CPU profile of the next secs seconds to
// <out>/<file>.pb.gz in the background, asking until base answers.
func (b *bench) profile(base, file string, secs int) (wait func()) {
	if !b.opts.pprof {
		return func() {}
	}
	path := filepath.Join(b.opts.out, file+".pb.gz")
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) && b.ctx.Err() == nil {
			err := saveURL(b.ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), path)
			if err == nil {
				b.logf("CPU profile %s: %s (go tool pprof -top %s)", file, path, path)
				return
			}
			_ = sleep(b.ctx, 20*time.Millisecond)
		}
	}()
	return func() { <-done }
}

// saveURL writes the body of a GET to path.
func saveURL(ctx context.Context, url, path string) error {
	resp, err := get(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// namedPid is a process the bench accounts CPU time to.
type namedPid struct {
	name string
	pid  int
}

// serverPids is the servers' processes: the Consul agents, etcd and
// kube-apiserver (when it runs).
func (b *bench) serverPids() []namedPid {
	var out []namedPid
	for _, s := range b.consul.Servers() {
		out = append(out, namedPid{fmt.Sprintf("consul-%d", s.Index), s.Agent().Pid()})
	}
	if b.kube != nil {
		out = append(out, namedPid{"kube-apiserver", b.kube.APIServer.Pid()}, namedPid{"etcd", b.kube.Etcd.Pid()})
	}
	return out
}

// cpuOf reads each process's CPU seconds (a process that cannot be read
// is left out).
func cpuOf(ps []namedPid) map[string]float64 {
	out := map[string]float64{}
	for _, p := range ps {
		if s, err := cpuSeconds(p.pid); err == nil {
			out[p.name] = s
		}
	}
	return out
}

// cpuSum is the CPU seconds all processes of after used since before (a
// process missing from before started in between).
func cpuSum(after, before map[string]float64) float64 {
	t := 0.0
	for name, s := range after {
		t += s - before[name]
	}
	return math.Round(t*100) / 100
}

// cpuNote lists each process's share of cpuSum against the machine's
// cores over wall.
func cpuNote(after, before map[string]float64, wall time.Duration) string {
	names := make([]string, 0, len(after))
	for name := range after {
		names = append(names, name)
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names)+1)
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", name, after[name]-before[name]))
	}
	return fmt.Sprintf("%s; the machine has %d cores x %.2f s = %.2f s", strings.Join(parts, ", "), runtime.NumCPU(), wall.Seconds(), float64(runtime.NumCPU())*wall.Seconds())
}

// quietCPU waits until the servers together use less than share of one core
// over a second (a Consul snapshot, or a compaction, left running into a
// measurement would take the cores the daemon is timed on), for at most
// timeout; it returns how long it waited, and whether they got quiet.
func (b *bench) quietCPU(share float64, timeout time.Duration) (time.Duration, bool) {
	start := time.Now()
	servers := b.serverPids()
	for time.Since(start) < timeout && b.ctx.Err() == nil {
		before, t0 := cpuOf(servers), time.Now()
		if sleep(b.ctx, time.Second) != nil {
			break
		}
		if cpuSum(cpuOf(servers), before)/time.Since(t0).Seconds() < share {
			return time.Since(start), true
		}
	}
	return time.Since(start), false
}

// consulRequests is Consul's own tally of the HTTP requests it served
// (consul_api_http, by method and path): how many, and the seconds spent
// serving them.
type consulRequests map[string]struct{ count, secs float64 }

func (b *bench) consulRequests() (consulRequests, error) {
	url := b.consul.HTTPAddr + "/v1/agent/metrics?format=prometheus"
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	resp, err := get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return parseConsulRequests(resp.Body)
}

// get GETs url and returns the answer if it is 200 (the caller closes its
// body).
func get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return resp, nil
}

// parseConsulRequests reads consul_api_http's counts and sums from a
// Prometheus exposition.
func parseConsulRequests(r io.Reader) (consulRequests, error) {
	out := consulRequests{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var count bool
		switch {
		case strings.HasPrefix(line, "consul_api_http_count{"):
			count = true
		case strings.HasPrefix(line, "consul_api_http_sum{"):
		default:
			continue
		}
		key := labelValue(line, "method") + " " + labelValue(line, "path")
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		e := out[key]
		if count {
			e.count = v
		} else {
			e.secs = v / 1000 // Consul's timers are in milliseconds
		}
		out[key] = e
	}
	return out, sc.Err()
}

// labelValue is the value of label name in one exposition line ("" when
// absent).
func labelValue(line, name string) string {
	i := strings.Index(line, name+`="`)
	if i < 0 {
		return ""
	}
	rest := line[i+len(name)+2:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return ""
}

// minus is what was served between o and r.
func (r consulRequests) minus(o consulRequests) consulRequests {
	out := consulRequests{}
	for k, e := range r {
		d := e
		d.count -= o[k].count
		d.secs -= o[k].secs
		if d.count > 0 {
			out[k] = d
		}
	}
	return out
}

// total is the number of requests.
func (r consulRequests) total() float64 {
	var n float64
	for _, e := range r {
		n += e.count
	}
	return n
}

// String lists the requests by path, the most time-consuming first.
func (r consulRequests) String() string {
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return r[keys[i]].secs > r[keys[j]].secs })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f (%.2f s)", k, r[k].count, r[k].secs))
	}
	return strings.Join(parts, ", ")
}
