// Package agenttest runs a package's tests beside one real Consul dev
// agent: the TestMain of the packages under consul/ whose tests cross
// Consul.
package agenttest
