package shard

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine of the Manager (watch, elections,
// handovers) outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
