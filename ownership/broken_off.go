//go:build !fleetsync_broken_mark

package ownership

// brokenMark is false in every real build. The soak's deliberately broken
// build (go build -tags fleetsync_broken_mark) sets it: Owns then takes
// any entry on the cluster's nodes for its own, mark or not, so the
// daemon overwrites a foreign entry that holds one of its IDs, and the
// soak's checker must report it (test/soak TestCheckerCatchesBrokenBuild).
const brokenMark = false
