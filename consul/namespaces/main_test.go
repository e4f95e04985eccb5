package namespaces

import (
	"os"
	"testing"

	"github.com/fleetsync/fleetsync/consul/internal/agenttest"
	"github.com/fleetsync/fleetsync/test/stack"
)

// agent is a real Consul (OSS) dev agent; nil under -short.
var agent *stack.Consul

func TestMain(m *testing.M) { os.Exit(agenttest.Main(m, &agent, false)) }
