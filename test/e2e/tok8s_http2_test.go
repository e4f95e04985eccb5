package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// TestToK8sHTTP2: Consul's HTTPS listener speaks HTTP/2, and its
// limits.http_max_conns_per_client counts TCP connections, not the
// requests on one. With default flags over HTTPS, 300 mirrored services
// (more than --to-k8s-max-watches's 128) are all watched: 300 blocking
// health queries, none polling, no cap, over a few connections; an
// instance added with a passing check (which the change feed would not
// see) reaches its slice within seconds, with the poll an hour away. A
// --to-k8s-max-watches given is honoured over HTTPS too; over plain HTTP
// the default cap stays.
func TestToK8sHTTP2(t *testing.T) {
	e := newEnv(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCA(t, dir)
	httpsPort := fixture.FreePort(t)
	own, err := stack.StartConsul(e.ctx, stack.ConsulOptions{ExtraArgs: []string{quietConsul,
		fmt.Sprintf(`-hcl=ports { https = %d }`, httpsPort),
		fmt.Sprintf(`-hcl=tls { defaults { ca_file = %q cert_file = %q key_file = %q verify_incoming = false } }`, caFile, certFile, keyFile),
	}})
	must(t, err)
	t.Cleanup(func() { _ = own.Stop() })
	httpsAddr := "127.0.0.1:" + strconv.Itoa(httpsPort)

	const n = 300
	p := e.cluster + "h"
	names, addrs := make([]string, n), make([]string, n)
	for i := range names {
		names[i], addrs[i] = fmt.Sprintf("%s-%03d", p, i), fmt.Sprintf("10.80.%d.%d", i/200, i%200+1)
	}
	// 60 services a transaction: a node op, then a service and its check each.
	for first := 0; first < n; first += 60 {
		node := fmt.Sprintf("%s-vm%d", p, first/60)
		ops := consulapi.TxnOps{{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeSet, Node: consulapi.Node{Node: node, Address: "10.80.9.1"}}}}
		for i := first; i < min(first+60, n); i++ {
			id := names[i] + "-i"
			ops = append(ops,
				&consulapi.TxnOp{Service: &consulapi.ServiceTxnOp{Verb: consulapi.ServiceSet, Node: node,
					Service: consulapi.AgentService{ID: id, Service: names[i], Address: addrs[i], Port: 8080}}},
				&consulapi.TxnOp{Check: &consulapi.CheckTxnOp{Verb: consulapi.CheckSet,
					Check: consulapi.HealthCheck{Node: node, CheckID: "check-" + id, Name: "check", Status: "passing", ServiceID: id}}})
		}
		ok, resp, _, err := own.Client.Txn().Txn(ops, nil)
		must(t, err)
		if !ok {
			t.Fatalf("register services %d-%d: %+v", first, first+59, resp.Errors)
		}
	}
	view := func(name, addrs string) string { return name + "-4-8080-0[IPv4:8080]: " + addrs }

	start := func(e *env, addr string, tls bool, args ...string) *fixture.Daemon {
		t.Helper()
		if tls {
			args = append([]string{"--consul-ssl", "--consul-ca-file=" + caFile}, args...)
		}
		return e.daemonAt(addr, e.cluster, []string{e.ns}, append([]string{"--to-k8s", "--k8s-write-namespace=" + e.ns}, args...)...)
	}

	// Default flags but the poll interval (an hour: nothing may wait for
	// it) and the Kubernetes write budget (600 first writes in seconds).
	began := time.Now()
	d := start(e, httpsAddr, true, "--to-k8s-allow="+p+"-*", "--to-k8s-poll-interval=1h", "--to-k8s-qps=500", "--to-k8s-burst=500")
	eventually(t, 90*time.Second, "every service mirrored", func() error {
		got, err := slicesByService(e)
		if err != nil {
			return err
		}
		missing := 0
		for i, name := range names {
			if got[name] != view(name, addrs[i]+"=true/true/false") {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d of %d services not mirrored yet", missing, n)
		}
		return nil
	})
	t.Logf("%d services mirrored %s after the start", n, time.Since(began).Round(time.Millisecond))
	eventually(t, 20*time.Second, "every health query blocking", func() error {
		body := scrape(t, d)
		b := metricValue(body, `fleetsync_tok8s_health_watches{mode="blocking"}`)
		q := metricValue(body, `fleetsync_tok8s_health_watches{mode="polling"}`)
		if limit, ok := metricLine(body, "fleetsync_tok8s_health_watches_max "); !ok || b != n || q != 0 || limit != "fleetsync_tok8s_health_watches_max 0" {
			return fmt.Errorf("blocking %v, polling %v, %q; want %d, 0 and no cap", b, q, limit, n)
		}
		return nil
	})
	conns := establishedTo(t, d.Pid(), httpsPort)
	t.Logf("%d blocking health queries over %d TCP connections to Consul's HTTPS port", n, conns)
	if conns > 10 {
		t.Errorf("%d connections to Consul's HTTPS port, want at most 10", conns)
	}
	if logs, err := os.ReadFile(d.LogPath); err != nil || strings.Count(string(logs), "Consul speaks HTTP/2") != 1 || strings.Contains(string(logs), "more services than --to-k8s-max-watches") {
		t.Errorf("the log should say once that Consul speaks HTTP/2 and never that the cap was reached (%v)", err)
	}

	// An instance added with a passing check: no check changes, so only
	// the service's own blocking query sees it.
	const added = "10.81.0.1"
	_, err = own.Client.Catalog().Register(&consulapi.CatalogRegistration{Node: p + "-vmx", Address: added,
		Service: &consulapi.AgentService{ID: names[7] + "-x", Service: names[7], Port: 8080},
		Checks:  consulapi.HealthChecks{{Node: p + "-vmx", CheckID: "check-x", Name: "check", Status: "passing", ServiceID: names[7] + "-x"}}}, nil)
	must(t, err)
	sent := time.Now()
	eps := []string{addrs[7] + "=true/true/false", added + "=true/true/false"}
	sort.Strings(eps)
	e.waitSlices(names[7], view(names[7], strings.Join(eps, " ")))
	took := time.Since(sent)
	t.Logf("an added instance in its slice after %s", took.Round(time.Millisecond))
	// The poll is an hour away; seconds leave room for a loaded machine.
	if took > 5*time.Second {
		t.Errorf("an added instance reached its slice after %s, want within seconds", took)
	}
	d.CloseT(t)

	// A cap given is honoured over HTTP/2: one blocking, two polling.
	e2 := newEnv(t)
	capped := start(e2, httpsAddr, true, "--to-k8s-allow="+strings.Join(names[:3], ","), "--to-k8s-max-watches=1")
	for i := range 3 {
		e2.waitSlices(names[i], view(names[i], addrs[i]+"=true/true/false"))
	}
	eventually(t, 20*time.Second, "the given cap held", func() error {
		body := scrape(t, capped)
		b := metricValue(body, `fleetsync_tok8s_health_watches{mode="blocking"}`)
		q := metricValue(body, `fleetsync_tok8s_health_watches{mode="polling"}`)
		if limit := metricValue(body, "fleetsync_tok8s_health_watches_max"); b != 1 || q != 2 || limit != 1 {
			return fmt.Errorf("blocking %v, polling %v, cap %v; want 1, 2 and 1", b, q, limit)
		}
		return nil
	})
	if strings.Contains(capped.LogTail(200), "Consul speaks HTTP/2") {
		t.Errorf("with --to-k8s-max-watches given, the log says the cap was lifted")
	}
	capped.CloseT(t)

	// Over plain HTTP (the shared agent) the default cap stays.
	e3 := newEnv(t)
	vmInstance(t, p+"-plain-vm", "10.82.0.1", p+"-plain", p+"-plain-i", "", 8080, "passing")
	plain := start(e3, consul.Addr, false, "--to-k8s-allow="+p+"-plain")
	e3.waitSlices(p+"-plain", view(p+"-plain", "10.82.0.1=true/true/false"))
	if limit := metricValue(scrape(t, plain), "fleetsync_tok8s_health_watches_max"); limit != 128 {
		t.Errorf("over plain HTTP: cap %v, want the default 128", limit)
	}
}

// slicesByService is sliceView of every Service of e.ns with mirrored
// slices, in one list.
func slicesByService(e *env) (map[string]string, error) {
	list, err := kube.Client.DiscoveryV1().EndpointSlices(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "endpointslice.kubernetes.io/managed-by=to-k8s.fleetsync.io"})
	if err != nil {
		return nil, err
	}
	parts := map[string][]string{}
	for _, s := range list.Items {
		svc := s.Labels[discoveryv1.LabelServiceName]
		parts[svc] = append(parts[svc], sliceLine(s))
	}
	out := make(map[string]string, len(parts))
	for svc, ps := range parts {
		sort.Strings(ps)
		out[svc] = strings.Join(ps, "; ")
	}
	return out, nil
}

// establishedTo counts the established TCP connections of process pid to
// port on the loopback: its sockets (/proc/<pid>/fd) found in the
// network namespace's table (/proc/<pid>/net/tcp).
func establishedTo(t *testing.T, pid, port int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	must(t, err)
	sockets := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			sockets[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/tcp", pid))
	must(t, err)
	defer f.Close()
	remote := fmt.Sprintf("0100007F:%04X", port) // 127.0.0.1:port, as the kernel writes it
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[2] == remote && fields[3] == "01" && sockets[fields[9]] {
			n++
		}
	}
	must(t, sc.Err())
	if len(sockets) == 0 {
		t.Fatalf("process %d has no sockets: not the daemon?", pid)
	}
	return n
}
