package claim

import (
	"os"
	"testing"

	"github.com/fleetsync/fleetsync/consul/internal/agenttest"
	"github.com/fleetsync/fleetsync/test/stack"
)

// agent is a real Consul dev agent for the tests that cross Consul; nil
// under -short.
var agent *stack.Consul

func TestMain(m *testing.M) { os.Exit(agenttest.Main(m, &agent, false)) }

func needConsul(t *testing.T) *stack.Consul { t.Helper(); return agenttest.Need(t, agent) }
