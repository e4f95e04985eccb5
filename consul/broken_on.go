//go:build fleetsync_broken_nodelete

package consul

// brokenNoDelete: see broken_off.go. Never ship this build.
const brokenNoDelete = true
