// Package bench measures replication on real ZFS in the guest, as ratios
// against baselines measured in the same run on the same pools:
//
//	make bench   (go test -run '^$' -bench . -benchtime 1x ./test/bench/)
//
// BenchmarkReplication: a volume holding -replication-mib (default 500)
// MiB of random data, sent in full from node n1 to node n2 by
//   - local:  zfs send | zfs recv between the two pools on one kernel (the ceiling);
//   - socat:  zfs send | socat | zfs recv over the nodes' veth, plaintext
//     (what syncoid's direct mode and openebs's nc do);
//   - driver: the driver's Replicate (mutual TLS gRPC between the agents);
//   - driver-plaintext: the same with -insecure-agent-port, to show what
//     TLS costs on this CPU (never a production setting).
//
// BenchmarkMigration: planned moves as Nomad sees them (the first
// ControllerPublishVolume, Nomad's retries, the stage on the new node),
// to a replica 10 MiB behind and to a node holding no copy, against a
// raw zfs send | socat | zfs recv of the same bytes just before each;
// medians of -moves and -full-moves moves, and where each move's time
// went (see its comment).
//
// BenchmarkScale: the latency of each CSI call about one volume with 10,
// 100 and 1000 volumes on each of three nodes, against raw zfs create and
// zfs list -d1 at the same counts, and the processes' memory
// (-scale-counts, -scale-reps).
//
// BenchmarkBackup: the same, backed up to a backup target and restored
// from it onto the other node, against zfs send | socat | zfs recv along
// the same paths (docs/backups.md, "Figures").
//
// BenchmarkTransport: the bare transport, 256 MiB over TLS on loopback,
// as gRPC chunked messages and as a plain stream on the same TLS setup.
//
// BenchmarkIdle: what a settled three-node cluster with the shipped
// settings costs when nothing happens, process by process, unscraped and
// scraped every 15 s (-idle-volumes, -idle-window; docs/architecture.md,
// "Scale").
package bench

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/node/agent"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run()) // no benchmark asked for (make test): no guest to boot
	}
	os.Exit(guesttest.Main(m, guesttest.Options{
		Disks:    []string{"3G", "3G", "3G", "3G"}, // the fourth: BenchmarkBackup's target
		Binaries: guesttest.DriverBinaries(),
		Timeout:  90 * time.Minute, // BenchmarkScale at 1000 volumes per node fills 3000 datasets
	}))
}

// The volume sizes the issues name. Flags, not environment variables: the
// guest gets the test's flags, not the host's environment.
var (
	replicationMiB = flag.Int("replication-mib", 500, "MiB of random data BenchmarkReplication sends")
)

func sh(b *testing.B, script string) string {
	b.Helper()
	out, err := guestcluster.Run("sh", "-c", script)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

func timed(f func()) time.Duration {
	start := time.Now()
	f()
	return time.Since(start)
}

func BenchmarkReplication(b *testing.B) {
	c := guesttest.StartCluster(b, 2, guestcluster.Options{LogLevel: "info"})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	v := filledVolume(b, c, n1)
	id, src, size, agent := v.id, v.dataset, v.size, v.agent

	var local, socat, driver, plaintext usage
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		local.add(measure(b, func() { sh(b, "zfs send -L -c "+src+"@bench | zfs recv -u "+n2.Pool+"/local") }))
		sh(b, "zfs destroy -r "+n2.Pool+"/local")

		socat.add(measure(b, func() { socatSend(b, n1, n2, src+"@bench", n2.Pool+"/socat") }))
		sh(b, "zfs destroy -r "+n2.Pool+"/socat")

		driver.add(measure(b, func() { push(b, agent, id, n2) }))
		dropReplica(b, n1, n2, id)
	}
	// Plaintext last: the nodes restart without TLS for it.
	b.StopTimer()
	for _, n := range c.Nodes {
		if err := n.RestartWith("-insecure-agent-port"); err != nil {
			b.Fatal(err)
		}
	}
	plainConn, err := grpc.NewClient(n1.AgentAddress, append(protocol.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		b.Fatal(err)
	}
	defer plainConn.Close()
	b.StartTimer()
	for i := 0; i < b.N; i++ {
		plaintext.add(measure(b, func() { push(b, agentclient.New(plainConn), id, n2) }))
		dropReplica(b, n1, n2, id)
	}
	b.StopTimer()
	mibps := func(u usage) float64 { return size / (1 << 20) / (u.wall.Seconds() / float64(b.N)) }
	// CPU seconds per GiB moved, all the guest's processes and kernel
	// together (both nodes share its vCPUs): what each path costs, apart
	// from how fast this machine is.
	cpuPerGiB := func(u usage) float64 { return u.cpu.Seconds() / float64(b.N) / (size / (1 << 30)) }
	b.ReportMetric(mibps(local), "local-MiB/s")
	b.ReportMetric(mibps(socat), "socat-MiB/s")
	b.ReportMetric(mibps(driver), "driver-MiB/s")
	b.ReportMetric(mibps(plaintext), "driver-plaintext-MiB/s")
	b.ReportMetric(mibps(driver)/mibps(socat), "driver/socat")
	b.ReportMetric(mibps(driver)/mibps(local), "driver/local")
	b.ReportMetric(cpuPerGiB(socat), "socat-cpu-s/GiB")
	b.ReportMetric(cpuPerGiB(driver), "driver-cpu-s/GiB")
	b.ReportMetric(cpuPerGiB(plaintext), "driver-plaintext-cpu-s/GiB")
	b.Logf("stream %.0f MiB; local %.1f, socat %.1f, driver %.1f (plaintext %.1f) MiB/s; driver/socat %.2f, driver/local %.2f",
		size/(1<<20), mibps(local), mibps(socat), mibps(driver), mibps(plaintext), mibps(driver)/mibps(socat), mibps(driver)/mibps(local))
	b.Logf("guest CPU (%d vCPUs): local %.1f, socat %.1f, driver %.1f, plaintext %.1f CPU-s/GiB; busy vCPUs: local %.2f, socat %.2f, driver %.2f, plaintext %.2f",
		runtime.NumCPU(), cpuPerGiB(local), cpuPerGiB(socat), cpuPerGiB(driver), cpuPerGiB(plaintext), local.busy(), socat.busy(), driver.busy(), plaintext.busy())
}

// usage is the wall time of a run and the CPU time the guest spent in it.
type usage struct{ wall, cpu time.Duration }

func (u *usage) add(v usage) { u.wall += v.wall; u.cpu += v.cpu }

// busy is how many vCPUs were busy on average.
func (u usage) busy() float64 { return u.cpu.Seconds() / u.wall.Seconds() }

// measure runs f and returns its wall time and the CPU time the whole
// guest spent meanwhile (all processes and the kernel, from /proc/stat).
func measure(b *testing.B, f func()) usage {
	before := cpuBusy(b)
	wall := timed(f)
	return usage{wall: wall, cpu: cpuBusy(b) - before}
}

// cpuBusy reads the time all CPUs spent not idle since boot.
func cpuBusy(b *testing.B) time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 9 || fields[0] != "cpu" {
		b.Fatalf("unexpected /proc/stat: %q", line)
	}
	var busy time.Duration
	for i, f := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		t, err := userTicks(f)
		if err != nil {
			b.Fatal(err)
		}
		busy += t
	}
	return busy
}

// userTicks reads a CPU time /proc counts in the kernel's USER_HZ ticks
// (1/100 s).
func userTicks(field string) (time.Duration, error) {
	n, err := strconv.ParseUint(field, 10, 64)
	const userHZ = 100
	return time.Duration(n) * time.Second / userHZ, err
}

// filled is a volume of -replication-mib MiB of random data on node n1,
// snapshotted as @bench, with a client of n1's agent.
type filled struct {
	ctl         csi.ControllerClient
	id, dataset string
	size        float64 // bytes of the snapshot's full stream (zfs send -L -c)
	agent       *agentclient.Client
}

// filledVolume makes the volume BenchmarkReplication and BenchmarkBackup
// send; the agent's connection closes with the benchmark.
func filledVolume(b *testing.B, c *guestcluster.Cluster, n1 *guestcluster.Node) filled {
	b.Helper()
	ctl, id := createVolume(b, c, "bench", n1.ID, 2<<30)
	src := n1.RootDataset + "/" + id
	fill(b, n1, id, "data", *replicationMiB)
	sh(b, "zfs snapshot "+src+"@bench")
	size, _ := strconv.ParseFloat(strings.Fields(sh(b, "zfs send -nP -L -c "+src+"@bench | awk '$1==\"size\"{print $2}'"))[0], 64)
	conn, err := c.DialAgent(n1.AgentAddress)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return filled{ctl: ctl, id: id, dataset: src, size: size, agent: agentclient.New(conn)}
}

// fill writes mib MiB of random data to file on the volume's copy on n.
func fill(b *testing.B, n *guestcluster.Node, id, file string, mib int) {
	mnt := filepath.Join(n.Dir, "fill-"+id)
	sh(b, fmt.Sprintf("mkdir -p %[1]s && mount -t zfs %[2]s/%[3]s %[1]s && dd if=/dev/urandom of=%[1]s/%[4]s bs=1M count=%[5]d 2>/dev/null && sync && umount %[1]s",
		mnt, n.RootDataset, id, file, mib))
}

// deleteVolume deletes volume id, again while the job of a move that
// just ended still demotes the old primary (Aborted, which a CO
// retries), for up to 30 s.
func deleteVolume(b *testing.B, ctl csi.ControllerClient, id string) {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := ctl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
		if err == nil {
			return
		}
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			b.Fatal(err)
		}
	}
}

// createVolume creates a volume of size bytes on node, uncompressed (the
// benchmarks write random data), through the controller, whose client it
// returns too.
func createVolume(b *testing.B, c *guestcluster.Cluster, name, node string, size int64) (csi.ControllerClient, string) {
	b.Helper()
	ctl := controllerClient(b, c)
	resp, err := ctl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		Parameters: map[string]string{"node": node, "compression": "off"}, VolumeCapabilities: []*csi.VolumeCapability{mountCapability}})
	if err != nil {
		b.Fatal(err)
	}
	return ctl, resp.GetVolume().GetVolumeId()
}

// push runs one Replicate to the end.
func push(b *testing.B, agent *agentclient.Client, id string, target *guestcluster.Node) {
	if _, err := agent.Replicate(context.Background(), id, agentclient.Target{Addr: target.AgentAddress, NodeID: target.ID}, "bench", nil); err != nil {
		b.Fatal(err)
	}
}

// dropReplica removes the replica and the bases, so the next push is full.
// It first waits (up to 30 s) for the receiver's tidy, which holds the
// received snapshot a second after the receive: a hold placed between the
// release and the destroy would fail the destroy.
func dropReplica(b *testing.B, n1, n2 *guestcluster.Node, id string) {
	ds := n2.RootDataset + "/" + id
	sh(b, "s=$(zfs list -H -t snapshot -o name -s createtxg -d 1 "+ds+" | tail -1); for i in $(seq 60); do zfs holds -H $s | grep -q zfs-nomad-base && break; sleep 0.5; done")
	sh(b, "zfs list -H -t snapshot -o name -d 1 "+ds+" | xargs -n1 zfs release zfs-nomad-base; zfs destroy -r "+ds)
	sh(b, "zfs list -H -t snapshot -o name -d 1 "+n1.RootDataset+"/"+id+" | grep @zn- | xargs -n1 zfs release zfs-nomad-base-n2 2>/dev/null; true")
}

// socatSend runs zfs send SEND | socat | zfs recv TARGET from n1 to n2
// over the veth, in the nodes' namespaces: SEND is a snapshot (a full
// stream) or "-i BASE SNAPSHOT".
func socatSend(b *testing.B, n1, n2 *guestcluster.Node, send, target string) {
	b.Helper()
	if err := n1.SendOverTCP(n2, "zfs send -L -c "+send, target); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTransport compares gRPC chunked streaming with a plain stream on
// the same TLS 1.3 setup, without ZFS: which framing to carry bulk data in.
func BenchmarkTransport(b *testing.B) {
	ca, err := tlsconfig.NewCA(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	srvFiles, _ := ca.Issue("srv", tlsconfig.RoleNode)
	cliFiles, _ := ca.Issue("cli", tlsconfig.RoleNode)
	srvM, _ := tlsconfig.Load(srvFiles)
	cliM, _ := tlsconfig.Load(cliFiles)
	const total = 256 << 20
	chunk := make([]byte, 1<<20)

	for _, tuned := range []bool{false, true} {
		name := "grpc-stream-default-windows"
		srvOpts := []grpc.ServerOption{grpc.Creds(srvM.ServerCredentials())}
		dialOpts := []grpc.DialOption{grpc.WithTransportCredentials(cliM.ClientCredentials())}
		if tuned {
			name = "grpc-stream-driver-windows"
			srvOpts = append(srvOpts, agent.ServerOptions()...)
			dialOpts = append(dialOpts, agent.DialOptions()...)
		}
		b.Run(name, func(b *testing.B) { grpcStream(b, srvOpts, dialOpts, total, chunk) })
	}

	b.Run("tls-plain-stream", func(b *testing.B) {
		lis, err := tls.Listen("tcp", "127.0.0.1:0", srvM.ServerConfig())
		if err != nil {
			b.Fatal(err)
		}
		defer lis.Close()
		go func() {
			for {
				c, err := lis.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(io.Discard, c); c.Close() }()
			}
		}()
		b.SetBytes(total)
		for i := 0; i < b.N; i++ {
			conn, err := tls.Dial("tcp", lis.Addr().String(), cliM.ClientConfig())
			if err != nil {
				b.Fatal(err)
			}
			for sent := 0; sent < total; sent += len(chunk) {
				if _, err := conn.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			conn.Close()
		}
	})
}

func grpcStream(b *testing.B, srvOpts []grpc.ServerOption, dialOpts []grpc.DialOption, total int, chunk []byte) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer(srvOpts...)
	pb.RegisterReplicationServer(srv, sink{})
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), dialOpts...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewReplicationClient(conn)
	b.SetBytes(int64(total))
	for i := 0; i < b.N; i++ {
		stream, err := client.Receive(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		for sent := 0; sent < total; sent += len(chunk) {
			if err := stream.Send(&pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: chunk}}); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			b.Fatal(err)
		}
	}
}

type sink struct {
	pb.UnimplementedReplicationServer
}

func (sink) Receive(stream pb.Replication_ReceiveServer) error {
	for {
		if _, err := stream.Recv(); err == io.EOF {
			return stream.SendAndClose(&pb.ReceiveResult{})
		} else if err != nil {
			return err
		}
	}
}

// controllerClient connects to the cluster's controller until the
// benchmark ends.
func controllerClient(b *testing.B, c *guestcluster.Cluster) csi.ControllerClient {
	conn, err := grpc.NewClient(c.ControllerEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return csi.NewControllerClient(conn)
}

// mountCapability is a single-node-writer file system.
var mountCapability = guestcluster.MountWriter()

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
