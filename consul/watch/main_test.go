package watch

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the feed's, the
// pollers' and the health queries' end with their contexts.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
