package stack

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// Leader returns the index of the server that leads, as every running server
// sees it. It waits (polling, until ctx ends) while there is none, the
// running servers disagree, or the one they name is not running: after a
// kill -9 of the leader the others name it until their election timeout
// (about a second) has passed and they have elected a new one.
func (c *Consul) Leader(ctx context.Context) (int, error) {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		i, err := c.leaderNow(ctx)
		if err == nil {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("consul leader: %w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// leaderNow asks every running server once.
func (c *Consul) leaderNow(ctx context.Context) (int, error) {
	byAddr := make(map[string]*ConsulServer, len(c.servers))
	var running []*ConsulServer
	for _, s := range c.servers {
		if s.Running() {
			byAddr[s.raftAddr()] = s
			running = append(running, s)
		}
	}
	if len(running) == 0 {
		return -1, fmt.Errorf("no server is running")
	}
	leader := ""
	for _, s := range running {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		code, body, err := httpGet(cctx, c.http, s.HTTPAddr+"/v1/status/leader", c.opts.Token)
		cancel()
		if err != nil {
			return -1, fmt.Errorf("%s: %w", s.NodeName, err)
		}
		l := strings.Trim(strings.TrimSpace(body), `"`)
		switch {
		case code != http.StatusOK || l == "":
			return -1, fmt.Errorf("%s: /v1/status/leader: %d %q", s.NodeName, code, body)
		case leader != "" && l != leader:
			return -1, fmt.Errorf("the servers disagree: %s names %s, another %s", s.NodeName, l, leader)
		}
		leader = l
	}
	s, ok := byAddr[leader]
	if !ok {
		return -1, fmt.Errorf("the leader %s is not a running server", leader)
	}
	return s.Index, nil
}

// SnapshotSave takes a snapshot of the whole state (catalog, KV, sessions,
// ACLs) through Client, from the leader, as `consul snapshot save` does.
func (c *Consul) SnapshotSave(ctx context.Context) ([]byte, error) {
	rc, _, err := c.Client.Snapshot().Save((&consulapi.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("consul snapshot save: %w", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("consul snapshot save: %w", err)
	}
	return b, nil
}

// SnapshotRestore replaces the whole state with snap (from SnapshotSave)
// through Client, as `consul snapshot restore` does: what was written after
// the snapshot is gone, what was deleted since is back. The leader returns
// once it has applied the snapshot and re-run its leader actions;
// SnapshotRestore then waits until every running server reads its own node
// consistently again. Raft's index goes on past the old one, but the
// X-Consul-Index of each endpoint is that of the snapshot's data: it goes
// back, until the next write to that data (the agent's anti-entropy may
// rewrite its own node within a second), which lands past every old index.
// A blocking query in flight returns at once with the old data and its old
// index.
func (c *Consul) SnapshotRestore(ctx context.Context, snap []byte) error {
	if err := c.Client.Snapshot().Restore((&consulapi.WriteOptions{}).WithContext(ctx), bytes.NewReader(snap)); err != nil {
		return fmt.Errorf("consul snapshot restore: %w", err)
	}
	ctx, cancel := withStartTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	for _, s := range c.servers {
		p := s.Agent()
		if p == nil || p.Exited() {
			continue
		}
		if err := waitFor(ctx, "consul node of "+s.NodeName+" after a snapshot restore", []*Process{p}, c.nodeCheck(s)); err != nil {
			return err
		}
	}
	return nil
}
