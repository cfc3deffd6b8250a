// Package agentcontract holds the contract test of the node agent: one
// table of the node's refusals and answers for the calls the controller's
// logic depends on (Reserve, Promote, Demote, MoveFinal, Unfence,
// GetCopy, DeleteReplica), run against the controller tests' in-memory
// fake (clustertest.FakeAgent) and against the real node (its assembly
// over an in-memory pool, reached through agentclient over in-memory
// gRPC). The node is the truth: a row the fake answers otherwise is a
// defect of the fake, which the controller's unit tests would otherwise
// trust. The package has tests only.
package agentcontract
