package consul

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

// agent is a real Consul dev agent for the tests that cross Consul; nil
// under -short.
var agent *stack.Consul

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if !testing.Short() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var err error
		agent, err = stack.StartConsul(ctx, stack.ConsulOptions{ExtraArgs: []string{"-hcl=disable_coordinates = true"}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "consul tests:", err)
			return 1
		}
		defer agent.Stop()
		// A fresh agent makes a few Raft applies of its own (autopilot,
		// its node): wait until that stops, so tests count only theirs.
		if err := quiesce(ctx, agent); err != nil {
			fmt.Fprintln(os.Stderr, "consul tests:", err)
			return 1
		}
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

func needConsul(t *testing.T) *stack.Consul {
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
