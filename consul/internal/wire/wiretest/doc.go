// Package wiretest holds Consul 1.14's own answers for a node of 1,000
// instances shaped like fleetsync's, and the 128-op transaction they came
// from, for the wire package's tests and the codec benchmarks
// (../codecbench). TestCaptureConsulAnswers in package wire writes them
// again from a real server agent.
package wiretest
