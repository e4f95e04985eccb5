package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

const (
	tok8sHTTPSNS = "tok8s-https" // where the to-k8s-https daemon mirrors
	// tok8sHTTPSIdle is the to-k8s-https scenario's idle: the reads of a
	// steady state, not the 10 minutes the to-k8s scenario proves 0
	// writes over.
	tok8sHTTPSIdle = 30 * time.Second
)

// toK8sHTTPS mirrors the to-k8s scenario's services x instances over
// Consul's HTTPS port, where Consul speaks HTTP/2 and the daemon lifts
// --to-k8s-max-watches (default flags otherwise): every service's health
// query blocks, on a few connections. It reports the blocking and polling
// queries, the connections, idle reads, and the check change and instance
// added / removed -> slice latencies, which over plain HTTP past the cap
// wait for a poll.
func (b *bench) toK8sHTTPS() error {
	const sc = "to-k8s-https"
	n, m := b.opts.tok8sServices, b.opts.tok8sInstances
	fmt.Printf("\n== %s: %d Consul services x %d instances mirrored over Consul's HTTPS port (HTTP/2; --to-k8s, default flags)\n", sc, n, m)
	b.stopDaemon()
	if b.consul.HTTPSAddr == "" || b.tls == nil {
		return fmt.Errorf("consul serves no HTTPS")
	}
	if err := fixture.Namespace(b.ctx, b.kc, tok8sHTTPSNS); err != nil {
		return err
	}
	start := time.Now()
	if err := b.resetVMs(n, m); err != nil {
		return err
	}
	b.logf("registered %d services x %d instances, every check passing, in %s", n, m, since(start))
	w, err := startSliceWatch(b.ctx, b.kc, tok8sHTTPSNS)
	if err != nil {
		return err
	}
	defer w.stop()
	d, err := b.startDaemon("fleetsync-tok8s-https", []string{tok8sHTTPSNS}, "--to-k8s", "--k8s-write-namespace="+tok8sHTTPSNS,
		"--consul-address="+b.consul.HTTPSAddr, "--consul-ssl", "--consul-ca-file="+b.tls.CA)
	if err != nil {
		return err
	}
	if err := b.untilMirrored(w, n, m, 10*time.Minute); err != nil {
		return err
	}
	b.res.add(sc, "first mirror: daemon start -> every slice complete", secs(time.Since(b.started)), "s",
		fmt.Sprintf("%d Services + EndpointSlices; --to-k8s-qps %d, --to-k8s-burst %d", 2*n, tok8sQPS, tok8sBurst))
	if err := b.allBlocking(sc, d, n); err != nil {
		return err
	}
	if err := b.tok8sIdle(sc, d, tok8sHTTPSIdle, "30s (fixed, not --to-k8s-idle)"); err != nil {
		return err
	}
	if err := b.tok8sLatency(sc, w, n); err != nil {
		return err
	}
	return b.tok8sAddLatency(sc, w, n, m)
}

// resetVMs leaves exactly n services x m instances on the VM nodes, every
// check passing: after the to-k8s scenario those nodes hold more services
// (the large one, the replicas' extra ones) and some critical checks, so
// the nodes (and with them all they hold) are deleted first.
func (b *bench) resetVMs(n, m int) error {
	nodes, _, err := b.consul.Client.Catalog().Nodes((&consulapi.QueryOptions{}).WithContext(b.ctx))
	if err != nil {
		return fmt.Errorf("consul nodes: %w", err)
	}
	var drop consulapi.TxnOps
	for _, nd := range nodes {
		if strings.HasPrefix(nd.Node, "vm-node-") {
			drop = append(drop, &consulapi.TxnOp{Node: &consulapi.NodeTxnOp{Verb: consulapi.NodeDelete, Node: consulapi.Node{Node: nd.Node}}})
		}
	}
	if len(drop) > 0 {
		if err := b.sendOps(drop); err != nil {
			return err
		}
		b.logf("deleted %d VM nodes an earlier scenario left, with their services", len(drop))
	}
	return b.registerVMs(n, m)
}

// allBlocking waits until the daemon holds a health query per service (n),
// fails unless every one blocks, and records the cap and the daemon's
// established connections to Consul's HTTPS port.
func (b *bench) allBlocking(sc string, d *fixture.Daemon, n int) error {
	deadline := time.Now().Add(time.Minute)
	var blocking, polling float64
	for {
		var err error
		if blocking, polling, err = b.healthWatches(d); err != nil {
			return err
		}
		if blocking+polling >= float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%.0f health queries blocking, %.0f polling a minute after the mirror; want %d in all", blocking, polling, n)
		}
		if err := sleep(b.ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	if polling > 0 {
		return fmt.Errorf("over HTTP/2 %.0f of %d health queries poll; want every one blocking", polling, n)
	}
	mx, _, _, err := scrape(b.ctx, d.HTTP, "fleetsync_tok8s_health_watches_max")
	if err != nil {
		return err
	}
	_, port, _ := strings.Cut(b.consul.HTTPSAddr, ":")
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("consul https address %q: %w", b.consul.HTTPSAddr, err)
	}
	conns, err := establishedTo(d.Pid(), p)
	if err != nil {
		return err
	}
	b.logf("%.0f health queries blocking, %.0f polling, over %d connections", blocking, polling, conns)
	b.res.add(sc, "health watches cap", mx["fleetsync_tok8s_health_watches_max"], "queries",
		fmt.Sprintf("fleetsync_tok8s_health_watches_max, 0: no cap (over plain HTTP the default --to-k8s-max-watches is 128); %.0f blocking, %.0f polling after the mirror", blocking, polling))
	b.res.add(sc, "TCP connections to Consul's HTTPS port", float64(conns), "connections",
		"the daemon's established sockets (/proc/<pid>/net/tcp{,6}); Consul's limits.http_max_conns_per_client (200) counts these, not the queries on them")
	return nil
}

// establishedTo counts process pid's established TCP connections whose
// remote port is port: the socket inodes of /proc/<pid>/fd looked up in
// the tables of its network namespace, IPv4 and IPv6.
func establishedTo(pid, port int) (int, error) {
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return 0, fmt.Errorf("sockets of %d: %w", pid, err)
	}
	own := map[string]bool{}
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil {
			if inode, ok := strings.CutPrefix(l, "socket:["); ok {
				own[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	suffix := fmt.Sprintf(":%04X", port)
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "net", table))
		if err != nil {
			return 0, err
		}
		rows := bufio.NewScanner(f)
		rows.Scan() // the header
		for rows.Scan() {
			// sl local rem st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			col := strings.Fields(rows.Text())
			const established = "01"
			if len(col) >= 10 && strings.HasSuffix(col[2], suffix) && col[3] == established && own[col[9]] {
				n++
			}
		}
		err = rows.Err()
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	return n, nil
}

// startTLS is setup's part for to-k8s-https: a throwaway CA for Consul's
// HTTPS listener.
func (b *bench) startTLS() error {
	dir, err := os.MkdirTemp("", "fleetsync-bench-tls-")
	if err != nil {
		return err
	}
	b.tlsDir = dir
	files, err := stack.WriteTLSFiles(dir)
	if err != nil {
		return err
	}
	b.tls = &files
	return nil
}
