package loss

// Signals, the label of fleetsync_consul_data_loss_detected_total.
const (
	SignalNodeVanished  = "node_vanished"
	SignalNodeRecreated = "node_recreated"
	SignalIndexBack     = "index_went_back"
	SignalEntryLost     = "entry_lost"
	SignalWorker        = "worker_evidence"
)

// Finding is one reason to believe Consul lost data.
type Finding struct {
	Signal string // one of the Signal constants
	Detail string // what was seen, for the log
}
