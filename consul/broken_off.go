//go:build !fleetsync_broken_nodelete

package consul

// brokenNoDelete is false in every real build. The soak's deliberately
// broken build (go build -tags fleetsync_broken_nodelete) sets it: Apply
// then drops every deregistration, so instances of endpoints that went
// away stay in Consul, and the soak's checker must report them (test/soak
// TestCheckerCatchesBrokenBuild).
const brokenNoDelete = false
