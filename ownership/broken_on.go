//go:build fleetsync_broken_mark

package ownership

// brokenMark: see broken_off.go. Never ship this build.
const brokenMark = true
