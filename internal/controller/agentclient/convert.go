package agentclient

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"

	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// The conversions from the protocol's messages. Each reads through the
// getters, so a nil message converts to the zero value.

func nodeInfoFromPB(n *pb.Node) NodeInfo {
	return NodeInfo{
		NodeID:              n.GetNodeId(),
		Topology:            n.GetTopology(),
		AvailableBytes:      n.GetAvailableBytes(),
		MaxQuotaBytes:       n.GetMaxQuotaBytes(),
		Volumes:             n.GetVolumes(),
		MaxVolumes:          n.GetMaxVolumes(),
		UnhealthyReason:     n.GetUnhealthyReason(),
		Version:             n.GetVersion(),
		VolumesVersion:      n.GetVolumesVersion(),
		KnownNodes:          int(n.GetKnownNodes()),
		RetiredNodes:        n.GetRetiredNodeIds(),
		Witnesses:           n.GetWitnesses(),
		OpenZFS:             n.GetOpenzfsVersion(),
		LeaseHeld:           n.GetLeaseHeld(),
		CertificateNotAfter: unixTime(n.GetCertificateNotAfter()),
		AwaitedPromotions:   convertAll(n.GetAwaitedPromotions(), awaitedFromPB),
	}
}

func awaitedFromPB(a *pb.AwaitedPromotion) AwaitedPromotion {
	return AwaitedPromotion{VolumeID: a.GetVolumeId(), AfterGeneration: a.GetAfterGeneration(),
		Waiting: time.Duration(a.GetWaitingMillis()) * time.Millisecond}
}

// unixTime is the time of unix seconds s, zero for 0.
func unixTime(s int64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(s, 0).UTC()
}

// The conversions of what a node says of its copies learn each volume's
// name for the log lines (volumelog), as the node's own reads do.

func volumeFromPB(v *pb.Volume) Volume {
	volumelog.Learn(v.GetVolumeId(), v.GetName())
	return Volume{
		VolumeID:             v.GetVolumeId(),
		Name:                 v.GetName(),
		CapacityBytes:        v.GetCapacityBytes(),
		UsedBytes:            v.GetUsedBytes(),
		Parameters:           v.GetParameters(),
		Source:               v.GetSource(),
		NodeID:               v.GetNodeId(),
		CreatedUnix:          v.GetCreatedUnix(),
		Generation:           v.GetGeneration(),
		MovingTo:             v.GetMovingTo(),
		FailoverFromSnapshot: v.GetFailoverFromSnapshot(),
	}
}

func snapshotFromPB(s *pb.Snapshot) Snapshot {
	return Snapshot{
		SnapshotID:     s.GetSnapshotId(),
		Name:           s.GetName(),
		SourceVolumeID: s.GetSourceVolumeId(),
		SizeBytes:      s.GetSizeBytes(),
		CreatedUnix:    s.GetCreatedUnix(),
		NodeID:         s.GetNodeId(),
		Deleted:        s.GetDeleted(),
		OwnerDigest:    s.GetOwnerDigest(),
	}
}

func progressFromPB(p *pb.ReplicateProgress) Progress {
	return Progress{
		Kind:       p.GetKind(),
		Snapshot:   p.GetSnapshot(),
		Base:       p.GetBase(),
		Bytes:      p.GetBytes(),
		TotalBytes: p.GetTotalBytes(),
		Done:       p.GetDone(),
		FencedAt:   p.GetFencedUnixNano(),
	}
}

func nodeStatusFromPB(st *pb.NodeStatus) NodeStatus {
	return NodeStatus{
		Replicas:  convertAll(st.GetReplicas(), replicaFromPB),
		Transfers: convertAll(st.GetTransfers(), transferFromPB),
		SetAside:  st.GetSetAside(),
		BackupFailures: convertAll(st.GetBackupFailures(), func(f *pb.BackupFailure) BackupFailure {
			return BackupFailure{VolumeID: f.GetVolumeId(), Target: f.GetTarget(), Error: f.GetError(), AtUnix: f.GetAtUnix()}
		}),
	}
}

func replicaFromPB(r *pb.Replica) Replica {
	volumelog.Learn(r.GetVolumeId(), r.GetName())
	return Replica{
		VolumeID:         r.GetVolumeId(),
		Name:             r.GetName(),
		LastSnapshot:     r.GetLastSnapshot(),
		LastSnapshotUnix: r.GetLastSnapshotUnix(),
		Resumable:        r.GetResumable(),
		DemotedAtUnix:    r.GetDemotedAtUnix(),
	}
}

func transferFromPB(t *pb.Transfer) Transfer {
	return Transfer{
		VolumeID:    t.GetVolumeId(),
		Peer:        t.GetPeer(),
		Kind:        t.GetKind(),
		Bytes:       t.GetBytes(),
		TotalBytes:  t.GetTotalBytes(),
		StartedUnix: t.GetStartedUnix(),
		Purpose:     t.GetPurpose(),
	}
}

func copyFromPB(c *pb.Copy) Copy {
	volumelog.Learn(c.GetVolumeId(), c.GetName())
	return Copy{
		VolumeID:             c.GetVolumeId(),
		NodeID:               c.GetNodeId(),
		Exists:               c.GetExists(),
		Role:                 c.GetRole(),
		Generation:           c.GetGeneration(),
		MovingTo:             c.GetMovingTo(),
		FencedUnixNano:       c.GetFencedUnixNano(),
		Mounted:              c.GetMounted(),
		LastSnapshot:         c.GetLastSnapshot(),
		LastSnapshotUnixNano: c.GetLastSnapshotUnixNano(),
		Parameters:           c.GetParameters(),
		CapacityBytes:        c.GetCapacityBytes(),
		Resumable:            c.GetResumable(),
		Name:                 c.GetName(),
		FailoverFromSnapshot: c.GetFailoverFromSnapshot(),
		PromisedGeneration:   c.GetPromisedGeneration(),
		PromisedHolder:       c.GetPromisedHolder(),
		SnapshotGUIDs:        c.GetSnapshotGuids(),
		ForcedGeneration:     c.GetForcedGeneration(),
		LeaseFenced:          c.GetLeaseFenced(),
		WrittenSince:         c.GetWrittenSince(),
		HistoryFrom:          c.GetHistoryFrom(),
	}
}

// convertAll converts a list of messages; nil stays nil.
func convertAll[M any, T any](in []M, convert func(M) T) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i, m := range in {
		out[i] = convert(m)
	}
	return out
}

func instanceToPB(in worklease.Instance) *pb.ControllerInstance {
	var started int64
	if !in.Started.IsZero() {
		started = in.Started.Unix()
	}
	return &pb.ControllerInstance{Id: in.ID, Host: in.Host, Address: in.Address, Version: in.Version, StartedUnix: started, NomadAllocId: in.NomadAlloc}
}

func instanceFromPB(in *pb.ControllerInstance) worklease.Instance {
	return worklease.Instance{ID: in.GetId(), Host: in.GetHost(), Address: in.GetAddress(), Version: in.GetVersion(), Started: unixTime(in.GetStartedUnix()), NomadAlloc: in.GetNomadAllocId()}
}

// workLeaseFromPB converts a node's answer about the work lease.
func workLeaseFromPB(l *pb.WorkLease) worklease.Lease {
	out := worklease.Lease{
		Granted:     l.GetGranted(),
		HolderSince: unixTime(l.GetHolderSinceUnix()),
		Remaining:   time.Duration(l.GetRemainingMillis()) * time.Millisecond,
		GrantsAfter: time.Duration(l.GetGrantsAfterMillis()) * time.Millisecond,
	}
	if l.GetHolder() != nil {
		out.Holder = instanceFromPB(l.GetHolder())
	}
	for _, seen := range l.GetSeen() {
		out.Seen = append(out.Seen, worklease.Seen{Instance: instanceFromPB(seen.GetInstance()), Ago: time.Duration(seen.GetLastSeenMillisAgo()) * time.Millisecond})
	}
	return out
}
