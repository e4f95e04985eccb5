package worker

import "github.com/fleetsync/fleetsync/worker/window"

// scheduler holds the window rules (package window) and whether the flush
// about to run is a leading edge.
type scheduler struct {
	window.Schedule
	isolated bool // the flush about to run is a leading edge
}

func (s *scheduler) state() State {
	if s.Failures > 0 {
		return StateBackingOff
	}
	return StatePending
}
