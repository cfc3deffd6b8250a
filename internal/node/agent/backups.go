package agent

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// BackupsServer serves a backup target's backups (pb.BackupsServer): the
// list and restore grants to the controller and operators, the backups
// themselves to the nodes granted their restore, named by their verified
// certificates.
type BackupsServer struct {
	pb.UnimplementedBackupsServer
	Target *replication.TargetReceiver
}

func (s *BackupsServer) ListBackups(ctx context.Context, req *pb.ListBackupsRequest) (*pb.ListBackupsResponse, error) {
	all, err := s.Target.Backups(ctx, req.GetVolumeId())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	resp := &pb.ListBackupsResponse{Target: s.Target.Name()}
	for _, b := range all {
		resp.Backups = append(resp.Backups, backupToPB(b))
	}
	return resp, nil
}

func (s *BackupsServer) GrantRestore(ctx context.Context, req *pb.GrantRestoreRequest) (*pb.GrantRestoreResponse, error) {
	grant, expires, err := s.Target.GrantRestore(ctx, req.GetVolumeId(), req.GetSnapshot(), req.GetNodeId())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	return &pb.GrantRestoreResponse{Grant: grant, ExpiresUnix: expires.Unix()}, nil
}

func (s *BackupsServer) SendBackup(req *pb.SendBackupRequest, stream pb.Backups_SendBackupServer) error {
	caller, _ := tlsconfig.NameOf(stream.Context())
	header := func(b replication.Backup) error {
		return stream.Send(&pb.SendBackupMessage{Msg: &pb.SendBackupMessage_Header{Header: backupToPB(b)}})
	}
	send := func(b []byte) error {
		return stream.Send(&pb.SendBackupMessage{Msg: &pb.SendBackupMessage_Data{Data: b}})
	}
	return errdefs.ToStatus(s.Target.SendBackup(stream.Context(), caller, req.GetVolumeId(), req.GetSnapshot(), req.GetGrant(), header, send))
}

func (s *BackupsServer) DeleteBackups(ctx context.Context, req *pb.DeleteBackupsRequest) (*pb.DeleteBackupsResponse, error) {
	deleted, err := s.Target.DeleteBackups(ctx, req.GetVolumeId(), req.GetSnapshot())
	if err != nil {
		return nil, errdefs.ToStatus(err)
	}
	return &pb.DeleteBackupsResponse{Deleted: deleted}, nil
}

func backupToPB(b replication.Backup) *pb.Backup {
	return &pb.Backup{VolumeId: b.VolumeID, VolumeName: b.VolumeName, Snapshot: b.Snapshot, ReceivedUnix: b.Received.Unix(),
		ReferencedBytes: b.Referenced, CapacityBytes: b.Capacity, Parameters: b.Parameters, Encrypted: b.Encrypted, CurrentChain: b.Current}
}

func backupFromPB(b *pb.Backup) replication.Backup {
	return replication.Backup{VolumeID: b.GetVolumeId(), VolumeName: b.GetVolumeName(), Snapshot: b.GetSnapshot(),
		Received: time.Unix(b.GetReceivedUnix(), 0), Referenced: b.GetReferencedBytes(), Capacity: b.GetCapacityBytes(),
		Parameters: b.GetParameters(), Encrypted: b.GetEncrypted(), Current: b.GetCurrentChain()}
}

// Fetch asks the backup target named target, at addr, for one backup,
// showing grant (replication.TargetPeers). The server must hold the
// target's certificate: the connection is held to its name.
func (p *ReplicationPeers) Fetch(ctx context.Context, addr, target, volumeID, snapshot, grant string) (replication.Backup, io.Reader, error) {
	conn, err := p.conns.Get(addr)
	if err != nil {
		return replication.Backup{}, nil, err
	}
	p.conns.ResetBackoff(addr)
	stream, err := pb.NewBackupsClient(tlsconfig.Bind(conn, target)).SendBackup(ctx, &pb.SendBackupRequest{VolumeId: volumeID, Snapshot: snapshot, Grant: grant})
	if err != nil {
		return replication.Backup{}, nil, errdefs.FromStatus(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return replication.Backup{}, nil, errdefs.FromStatus(err)
	}
	h := first.GetHeader()
	if h == nil || h.GetVolumeId() != volumeID || h.GetSnapshot() != snapshot {
		return replication.Backup{}, nil, fmt.Errorf("backup target %s at %s began its answer with no header for backup %s of volume %s", target, addr, snapshot, volumeID)
	}
	return backupFromPB(h), &fetched{stream: stream}, nil
}

// fetched reads a backup's data messages as a stream.
type fetched struct {
	stream pb.Backups_SendBackupClient
	rest   []byte
}

func (f *fetched) Read(p []byte) (int, error) {
	return readData(&f.rest, p, func() ([]byte, error) {
		msg, err := f.stream.Recv()
		switch {
		case err == io.EOF:
			return nil, io.EOF
		case err != nil:
			return nil, errdefs.FromStatus(err)
		}
		return msg.GetData(), nil
	})
}
