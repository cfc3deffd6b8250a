package vocab

// VolumeRequest asks a node for a volume: the CSI name (the ID derives
// from it), the capacity range (0 when unset), the submitter's
// parameters and at most one content source. The controller sends it
// (agentclient.NewVolume) and the node acts on it (volume.CreateRequest):
// one type, so the two sides cannot drift apart.
type VolumeRequest struct {
	Name             string
	RequiredBytes    uint64
	LimitBytes       uint64
	Parameters       map[string]string
	SourceSnapshotID string
	SourceVolumeID   string
}
