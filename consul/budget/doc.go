// Package budget is the write budget every worker shares: at most a rate
// of transactions per second and a number in flight, with priority for
// the changes that only remove instances or come after a quiet window.
// A nil *Budget allows everything.
package budget
