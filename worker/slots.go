package worker

// Slots bounds how many workers do one kind of work at once (see
// Options.Looks). A nil *Slots bounds nothing.
type Slots struct{ c chan struct{} }

// NewSlots returns n slots (n < 1: one).
func NewSlots(n int) *Slots { return &Slots{c: make(chan struct{}, max(n, 1))} }

// acquire waits for a free slot. Nothing a holder does waits for another
// worker, so the wait is bounded by the holders' work.
func (s *Slots) acquire() {
	if s != nil {
		s.c <- struct{}{}
	}
}

func (s *Slots) release() {
	if s != nil {
		<-s.c
	}
}

// InUse is how many slots are held.
func (s *Slots) InUse() int {
	if s == nil {
		return 0
	}
	return len(s.c)
}

// Size is how many slots there are (0 for nil: unbounded).
func (s *Slots) Size() int {
	if s == nil {
		return 0
	}
	return cap(s.c)
}
