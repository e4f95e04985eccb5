package admin

import (
	"context"
	"os"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/internal/agenttest"
	"github.com/fleetsync/fleetsync/test/stack"
)

// For the tests of package admin_test.

// PurgeFenceMeta is purgeFenceMeta.
const PurgeFenceMeta = purgeFenceMeta

// NewPurgePlan is newPurgePlan.
var NewPurgePlan = newPurgePlan

// Summarize is summarize.
var Summarize = summarize

// NodeFate is what removeNode did with one node.
type NodeFate struct {
	Removed, Gone bool
	Why           string
}

// RemoveNode is removeNode on nc.
func RemoveNode(ctx context.Context, nc nodeCatalog, c consul.ClusterOwner, node *api.Node) (NodeFate, error) {
	f, err := removeNode(ctx, nc, c, node)
	return NodeFate{Removed: f.removed, Gone: f.gone, Why: f.why}, err
}

// PlanNodes are the nodes of p as read.
func PlanNodes(p PurgePlan) []*api.Node { return p.nodes }

// agent is a real Consul dev agent for the tests that cross Consul; nil
// under -short.
var agent *stack.Consul

func TestMain(m *testing.M) { os.Exit(agenttest.Main(m, &agent, false)) }

// Agent is the package's real Consul agent; the test is skipped under
// -short.
func Agent(t *testing.T) *stack.Consul { t.Helper(); return agenttest.Need(t, agent) }
