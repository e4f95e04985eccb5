package agenttest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetsync/fleetsync/test/stack"
)

// Main starts a Consul dev agent (none under -short), stores it in
// *agent, runs m, stops the agent and fails the run when a test leaked a
// goroutine. With settle, it first waits until the fresh agent stops
// making Raft applies of its own (autopilot, its node), so tests count
// only theirs. It returns the exit code for os.Exit.
func Main(m *testing.M, agent **stack.Consul, settle bool) int {
	flag.Parse()
	if !testing.Short() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		a, err := stack.StartConsul(ctx, stack.ConsulOptions{ExtraArgs: []string{"-hcl=disable_coordinates = true"}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "consul tests:", err)
			return 1
		}
		defer a.Stop()
		if settle {
			if err := quiesce(ctx, a); err != nil {
				fmt.Fprintln(os.Stderr, "consul tests:", err)
				return 1
			}
		}
		*agent = a
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreAnyFunction(stack.SpawnerFunction)); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			return 1
		}
	}
	return code
}

// Need returns agent, or skips t when there is none (under -short).
func Need(t testing.TB, agent *stack.Consul) *stack.Consul {
	t.Helper()
	if agent == nil {
		t.Skip("needs a real Consul agent; skipped under -short")
	}
	return agent
}

func quiesce(ctx context.Context, a *stack.Consul) error {
	last, err := a.RaftApplies()
	for err == nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second): // a measurement interval
		}
		var now float64
		if now, err = a.RaftApplies(); err == nil && now == last {
			return nil
		}
		last = now
	}
	return err
}
