// Package nomad runs the driver under a real Nomad, end to end, in the ZFS
// guest: one Nomad server and three Nomad clients, each client a simulated
// node (package guestcluster) with its own pool, network and mount namespace, and
// for the docker flavour its own Docker Engine. The plugins are deployed
// from the job files in nomad/ that users get (the images under the docker
// driver) and, in a shorter scenario, from nomad/raw_exec/; only their
// variables are set here.
//
// Nomad and the images are not built here: hack/nomad.sh builds Nomad
// once from the Go module proxy and caches it, hack/images.sh writes the
// images' archives, hack/prometheus-server.sh builds Prometheus, and
// `make test-nomad` passes their paths in ZFS_NOMAD_NOMAD,
// ZFS_NOMAD_IMAGES and ZFS_NOMAD_PROMETHEUS. Without Nomad the package is
// skipped; without the images, the docker flavour is; without
// Prometheus, its checks are.
package nomad

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// envNomad names the Nomad binary on the host.
const envNomad = "ZFS_NOMAD_NOMAD"

// narrate turns the test into `make demo-nomad`: each step, each Nomad
// command and what the job found are told on standard output as they
// happen, for a reader rather than for a test log.
var narrate = flag.Bool("narrate", false, "tell the scenario on standard output as it runs (make demo-nomad)")

func TestMain(m *testing.M) {
	files := map[string]string{}
	if path := os.Getenv(envNomad); path != "" {
		files["nomad"] = path
	} else if !guesttest.InGuest() {
		fmt.Printf("test/nomad: %s is not set: skipping the Nomad end-to-end test (make test-nomad builds Nomad and sets it)\n", envNomad)
		os.Exit(0)
	}
	if path := os.Getenv(envPrometheus); path != "" {
		files["prometheus"] = path
	}
	if dir := os.Getenv(envImages); dir != "" {
		for _, name := range imageArchives {
			files[name] = filepath.Join(dir, name)
		}
	}
	os.Exit(guesttest.Main(m, guesttest.Options{
		// Room for the many-volume drain's 1 GiB volume and its copy.
		// The fourth: the backup target's pool.
		Disks:    []string{"4G", "4G", "4G", "1G"},
		Binaries: guesttest.DriverBinaries(),
		Files:    files,
		// Each node's Docker Engine keeps its images in memory (about
		// 250 MB a node).
		Memory:  "4G",
		Docker:  true,
		Timeout: 55 * time.Minute,
	}))
}

const (
	serverIP = "10.77.0.254" // the bridge's address in the root namespace
	apiAddr  = "http://" + serverIP + ":4646"
	// nomadDir is each client's own tmpfs in its mount namespace: the same
	// path on every client, as stage_publish_base_dir needs.
	nomadDir = "/nomad"
)

// e2e is the running Nomad cluster.
type e2e struct {
	t       *testing.T
	c       *guestcluster.Cluster
	flavour flavour
	bin     string // directory of nomad, zfs-node, zfs-controller, the image archives
	repo    string
	nodeIDs map[string]string // Nomad node name (n1) -> Nomad node ID
	procs   []*guestcluster.Process
	images  map[string]string // image archive -> the name it loaded as (docker flavour)
	pki     string            // the certificates docs/install.md has the operator make
	// target is the backup target the plugins know as backupTarget
	// (nil: none).
	target *guestcluster.Target
	// encrypt: the scenario's volumes are encrypted. Only where the
	// guest's kernel module is free of OpenZFS 2.1's encrypted-mount
	// defect (docs/security.md: an oops that hangs the node's ZFS, met
	// in this scenario's drain): on 2.1 nodes the docs say to leave
	// encryption out, and so does the test (make test-nomad-trixie runs
	// it encrypted on 2.3).
	encrypt bool
}

// nomadBinDir is the directory of the binaries, or skips the test
// without Nomad.
func nomadBinDir(t *testing.T) string {
	bin := guesttest.BinDir(t)
	if _, err := os.Stat(filepath.Join(bin, "nomad")); err != nil {
		t.Skipf("no Nomad binary: set %s (make test-nomad does)", envNomad)
	}
	return bin
}

// TestNomadEndToEnd runs the whole scenario with what nomad/ ships: the
// plugins' images under the docker driver, the example job in a container.
func TestNomadEndToEnd(t *testing.T) {
	bin := nomadBinDir(t)
	haveImages(t, bin)
	e := start(t, bin, dockerFlavour)
	e.encrypt = !guesttest.EncryptedMountDefect(t)

	e.startBackupTarget()
	e.step("deploy the plugins from nomad/ under the docker driver", e.deployPlugins)
	e.step("zfs-controller status as the operator's first command: the agents found through Nomad", e.statusThroughNomad)
	prometheus := false
	e.step("a real Prometheus finds both plugins through Nomad's service discovery", func() { prometheus = e.startPrometheus() })

	var first, moved allocation
	e.step("create a replicated volume (encrypted but on OpenZFS 2.1) and run the example job on it", func() {
		e.createVolume(e.writeFile("web-data.hcl", e.withSecrets(e.readFile(e.file("volume.hcl")))))
		first = e.runCounter("web-data")
		e.tell("the counter job runs on %s and wrote data.bin, sha256 %.16s...", first.node, first.data)
		e.wantKeyLoadedOnlyOn(e.externalID("web-data"), first.node)
	})

	e.step("another namespace's team creates a volume of the same name, and registers this one's ID: both refused", func() {
		e.otherTeamIsKeptOut(first)
	})

	e.step("restart the node plugin under the job: its container finds the volume's mounts", func() {
		// The mounts a plugin's container made live on in the client's
		// mount namespace; the next container must see them through
		// Nomad's bind of the staging directory, or the drain below
		// could not unmount the volume.
		heldBefore := strings.Count(e.pluginLog("zfs-nomad-node", "zfs-node", first.node), "lease held")
		e.restartTask("zfs-nomad-node", "zfs-node", first.node)
		e.waitForPlugins(3, "")
		e.waitForChecks("zfs-nomad-node-metrics", 3)
		// The new process holds no lease until its pings reach a
		// majority: its first beat may find the lease lost (the peers'
		// connections not up yet) and make the job's volume read-only
		// until the next beat (docs/safety.md, "Leases"). The next step
		// counts lease losses from here, so wait for the hold.
		e.eventually(time.Minute, "the restarted node plugin holding its lease", func() error {
			if strings.Count(e.pluginLog("zfs-nomad-node", "zfs-node", first.node), "lease held") <= heldBefore {
				return fmt.Errorf("its log says %q no more than before the restart", "lease held")
			}
			return nil
		})
		if now := e.waitForCounter(""); now.id != first.id {
			t.Fatalf("the counter job runs as %s on %s after the plugin's restart, want %s unchanged", now.id, now.node, first.id)
		}
	})

	e.step("rotate every certificate through its Nomad variable while a backup runs and the job writes", func() {
		e.rotateCertificates(first)
	})

	e.step("drain the job's node, and kill the client of the controller holding the work lease in the middle of the move: the job and its data move", func() {
		// An operator drains a settled job: a drain during a deployment
		// is another story.
		moved = e.drainWhileTheHolderDies(first)
		e.wantKeyLoadedOnlyOn(e.externalID("web-data"), moved.node)
		e.nomad("node", "drain", "-disable", "-yes", e.nodeIDs[first.node])
		e.nomad("node", "eligibility", "-enable", e.nodeIDs[first.node])
	})

	var snapID string
	var autoNode string // the node the failover=auto step kills
	e.step("snapshot, and a volume from the snapshot", func() {
		e.nomad("volume", "snapshot", "create", "web-data", "snap1")
		snapID = e.snapshotID("web-data")
		e.nomad("job", "stop", "-purge", "counter")
		e.createVolume(e.writeFile("restored.hcl", e.fromSnapshotSpec("web-data-restored", snapID)))
		restored := e.runCounter("web-data-restored")
		e.wantSameData(moved, restored, false)
		e.wantKeyLoadedOnlyOn(e.externalID("web-data-restored"), restored.node)
		e.nomad("job", "stop", "-purge", "counter")
		// Nomad sends a snapshot delete only the secrets its command
		// line gives, and a snapshot of a volume with an owner is
		// deleted only with the owner's.
		if out, err := e.run("volume", "snapshot", "delete", "zfs-nomad", snapID); err == nil || !strings.Contains(out, contract.SecretOwner) {
			t.Fatalf("a snapshot delete without the owner secret: %v\n%s\nwant it refused, naming %s", err, out, contract.SecretOwner)
		}
		e.nomad("volume", "snapshot", "delete", "-secret", contract.SecretOwner+"="+testOwnerSecret, "zfs-nomad", snapID)
		if out := e.nomad("volume", "snapshot", "list", "-plugin", "zfs-nomad"); strings.Contains(out, snapID) {
			t.Fatalf("snapshot %s still listed after delete:\n%s", snapID, out)
		}
	})

	e.step("back the volume up to a host outside the cluster, and restore it with nomad volume create", func() {
		id := e.externalID("web-data")
		e.operator("backup", "-target", backupTarget, id)
		backupID := e.snapshotID("web-data") // its one snapshot deleted: the backup
		if !strings.HasPrefix(backupID, "backup:"+backupTarget+":") {
			t.Fatalf("nomad volume snapshot list shows %s for web-data, want its backup on %s", backupID, backupTarget)
		}
		e.createVolume(e.writeFile("from-backup.hcl", e.fromSnapshotSpec("web-data-from-backup", backupID)))
		restored := e.runCounter("web-data-from-backup")
		e.wantSameData(moved, restored, false)
		e.nomad("job", "stop", "-purge", "counter")
	})

	e.step("delete the volumes: nothing is left on any node", func() {
		// The drain left the old primary behind as a replica (or the
		// schedule made one): the delete must remove it too.
		id := e.externalID("web-data")
		e.eventually(time.Minute, "copies of web-data on two nodes", func() error {
			if holders := e.holders(id); len(holders) < 2 {
				return fmt.Errorf("held by %v", holders)
			}
			return nil
		})
		if prometheus {
			e.wantLagSeriesOn(id, moved.node)
		}
		for _, id := range []string{"web-data-restored", "web-data-from-backup", "web-data"} {
			e.eventually(time.Minute, "delete of "+id, func() error {
				out, err := e.run("volume", "delete", id)
				if err == nil {
					e.show("nomad volume delete "+id, out)
				}
				return err
			})
		}
		e.eventually(30*time.Second, "datasets gone", e.onlyRootDatasets)
		e.tell("no node holds a dataset or snapshot besides its root dataset")
	})

	if *drainMany {
		e.step("drain a client holding eight volumes: every job moves with its data", e.drainManyVolumes)
	}

	// Before a node is killed: the controller has run since the plugins
	// were deployed, through creates, a drain, snapshots and deletes.
	e.tell("FIGURE the plugins' memory and CPU weight (each task's cgroup; memory.max and cpu.weight from the job files' resources), beside the Nomad agents':\n%s",
		pluginMemory("zfs-node", "zfs-controller", "nomad"))

	e.step("failover=auto: the job's node is lost and the job comes back elsewhere", func() {
		autoNode = e.failoverAuto()
	})

	if *failoverManual {
		e.step("failover=manual: the job waits until the operator promotes a replica", func() {
			e.failoverManual(autoNode, prometheus)
		})
	}
}

// failoverManual adds the failover=manual step to the end-to-end run
// (make test-nomad). Not part of make test: test/migration proves the
// driver's side on real ZFS (TestFailoverManual: Unavailable until
// zfs-controller promote; TestAForcedPrimaryIsUnderTheLeaseOnceTheMajorityReturns:
// promote -force), and monitoring/alerts.yml's tests the lease alert's
// rule (make alerts); what this step adds, Nomad's failed claim naming
// the command and the alert through a real Prometheus, costs about four
// minutes (3m42s, 2026-12-07), which CI's 90 minutes do not have.
var failoverManual = flag.Bool("failover-manual", false, "also fail over a failover=manual volume with zfs-controller promote -force")

// failoverManual runs a failover=manual volume's job, kills its node
// (autoNode, which the failover=auto step killed, stays dead: two of
// three nodes are lost), and checks that the last node loses its lease,
// that Nomad's claim elsewhere fails naming zfs-controller promote, and
// that promote -force brings the job back with its data; with
// prometheus, that ZfsNomadNodeLeaseLost fires on the last node and
// resolves once the killed node is back.
func (e *e2e) failoverManual(autoNode string, prometheus bool) {
	e.t.Helper()
	e.nomad("job", "stop", "-purge", "counter")
	// The controller may have died with the node the last step
	// killed; creating a volume needs its replacement.
	e.waitForPlugins(2, autoNode)
	spec := strings.ReplaceAll(e.readFile(e.file("volume.hcl")), `"web-data"`, `"web-data-manual"`)
	e.createVolume(e.writeFile("manual.hcl", spec))
	before := e.runCounter("web-data-manual")
	id := e.externalID("web-data-manual")
	e.backup(id)
	e.waitForDeployment("counter")
	last := ""
	for _, n := range e.c.Nodes {
		if n.ID != before.node && n.ID != autoNode {
			last = n.ID
		}
	}
	lostBefore, err := e.taskLogCount(last, "zfs-node", "lease lost")
	if err != nil {
		e.t.Fatal(err)
	}
	e.killNode(before.node)
	// The last node hears from no majority of its peers now: with the
	// peers the node job renders, it loses its lease within 30 s (its
	// mounted primaries would turn read-only; the operator's -force
	// copy below is exempt). Without peers it never would.
	e.eventually(time.Minute, "node "+last+" reporting its lease lost", func() error {
		n, err := e.taskLogCount(last, "zfs-node", "lease lost")
		if err == nil && n <= lostBefore {
			err = fmt.Errorf("its zfs-node logs say %q %d times, as before the kill", "lease lost", n)
		}
		return err
	})
	e.tell("%s lost its lease: it hears from no majority of its peers", last)
	hint := e.waitForFailedClaim("zfs-controller promote")
	e.tell("Nomad cannot claim the volume elsewhere: %s", hint)
	replica := ""
	for _, n := range e.holders(id) {
		if n != before.node {
			replica = n
		}
	}
	// The node the last step killed stays dead, so two of the three
	// are gone: no majority can answer, and only the operator, who
	// knows both nodes are lost, can vouch for the replica (-force).
	e.operator("promote", "-force", "-node", replica, id)
	after := e.waitForCounter(before.id)
	e.wantSameData(before, after, true)
	if prometheus {
		// The last node has held no lease since the kill: the alert
		// fires after its minute, and resolves once a killed node is
		// back and the two make a majority again.
		e.waitForAlert(2*time.Minute, "ZfsNomadNodeLeaseLost", e.node(last), "firing")
		e.restartClient(before.node)
		e.waitForAlert(3*time.Minute, "ZfsNomadNodeLeaseLost", e.node(last), "")
	}
}

// fromSnapshotSpec is the volume specification of nomad volume create
// for a volume id made from snapshotID (a snapshot's, or a backup's),
// with its source's owner secret and, when e.encrypt, its passphrase.
func (e *e2e) fromSnapshotSpec(id, snapshotID string) string {
	key := ""
	if e.encrypt {
		key = fmt.Sprintf("\n  encryption_key = %q", testPassphrase)
	}
	return fmt.Sprintf(`id = %[1]q
name = %[1]q
type = "csi"
plugin_id = "zfs-nomad"
snapshot_id = %[2]q
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
secrets {
  owner_secret   = %[4]q%[3]s
}
`, id, snapshotID, key, testOwnerSecret)
}

// TestNomadRawExec is the shorter scenario for clients without Docker:
// the plugins from nomad/raw_exec/ under raw_exec, the example job under
// exec; a volume is created, written, drained to another client with its
// data, and deleted with its copies.
func TestNomadRawExec(t *testing.T) {
	e := start(t, nomadBinDir(t), rawExecFlavour)
	e.step("deploy the plugins from nomad/raw_exec/ while n3 lacks the pool's meta: no node plugin there until it has it", func() {
		// docs/install.md has the operator mark the clients with a pool
		// by their meta; the node job's constraint must keep it off the
		// others, and place it when a client gains one.
		n3 := e.c.Nodes[2]
		e.setRootDatasetMeta(n3, "")
		e.deployPluginsOn(2)
		if on := e.runningAllocations("zfs-nomad-node"); slices.Contains(on, n3.ID) || len(on) != 2 {
			t.Fatalf("the node job runs on %v, want the two clients with the meta, not %s", on, n3.ID)
		}
		e.setRootDatasetMeta(n3, n3.RootDataset)
		e.waitForPlugins(3, "")
		e.waitForChecks("zfs-nomad-node-metrics", 3)
	})
	var first allocation
	e.step("create a replicated volume and run the example job on it under exec", func() {
		e.createVolume(e.file("volume.hcl"))
		first = e.runCounter("web-data")
	})
	e.step("drain the job's node: the job and its data move", func() {
		e.waitForDeployment("counter")
		e.nomad("node", "drain", "-enable", "-yes", "-ignore-system", "-deadline", "2m", e.nodeIDs[first.node])
		moved := e.waitForCounter(first.id)
		e.logFailedAllocations()
		e.wantSameData(first, moved, true)
	})
	e.step("delete the volume: nothing is left on any node", func() {
		e.nomad("job", "stop", "-purge", "counter")
		e.eventually(time.Minute, "delete of web-data", func() error {
			_, err := e.run("volume", "delete", "web-data")
			return err
		})
		e.eventually(30*time.Second, "datasets gone", e.onlyRootDatasets)
	})
}

// step runs one part of the scenario and logs its duration.
func (e *e2e) step(name string, fn func()) {
	e.t.Helper()
	began := time.Now()
	if *narrate {
		fmt.Printf("\n\033[1m== %s\033[0m\n", name)
	} else {
		e.t.Logf("== %s", name)
	}
	fn()
	e.tell("(%s)", time.Since(began).Round(100*time.Millisecond))
}

// tell says something worth knowing: on standard output when narrating,
// else in the test log.
func (e *e2e) tell(format string, args ...any) {
	e.t.Helper()
	if *narrate {
		fmt.Printf("   "+strings.TrimPrefix(format, "FIGURE ")+"\n", args...)
		return
	}
	e.t.Logf(format, args...)
}

// start sets up three simulated nodes without zfs-node, a Nomad server in
// the root namespace and a Nomad client in each node.
func start(t *testing.T, bin string, f flavour) *e2e {
	began := time.Now()
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	mountCgroups(t, nil)
	if f.docker {
		// Before the nodes' namespaces exist, so that all of them see it.
		guesttest.Run(t, "sh", "-c", fmt.Sprintf("mkdir -p %[1]s && { grep -q ' %[1]s tmpfs ' /proc/self/mounts || mount -t tmpfs tmpfs %[1]s; } && rm -rf %[1]s/*", dockerDir))
	}
	c := guesttest.StartCluster(t, 3, guestcluster.Options{NoNodeProcesses: true, NoController: true})
	e := &e2e{t: t, c: c, flavour: f, bin: bin, repo: repo, nodeIDs: map[string]string{}}
	t.Cleanup(e.stop)

	e.makeCertificates()
	server, err := c.StartProcess("nomad-server", filepath.Join(bin, "nomad"), "agent", "-config", e.writeFile("server.hcl", serverConfig(c.Dir())))
	if err != nil {
		t.Fatal(err)
	}
	e.procs = append(e.procs, server)
	for _, n := range c.Nodes {
		e.prepareNode(n)
	}
	if f.docker {
		e.images = e.startDocker()
	}
	for _, n := range c.Nodes {
		p, err := n.StartProcess("nomad-"+n.ID, filepath.Join(bin, "nomad"), "agent", "-config", e.writeFile("client-"+n.ID+".hcl", e.clientConfig(n)))
		if err != nil {
			t.Fatal(err)
		}
		e.procs = append(e.procs, p)
	}
	e.eventually(2*time.Minute, "three ready Nomad clients", func() error {
		var nodes []struct{ ID, Name, Status string }
		if err := e.get("/v1/nodes", &nodes); err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Status == "ready" {
				e.nodeIDs[n.Name] = n.ID
			}
		}
		if len(e.nodeIDs) != 3 {
			return fmt.Errorf("clients ready: %v", e.nodeIDs)
		}
		return nil
	})
	e.tell("FIGURE Nomad cluster ready: %s", time.Since(began).Round(100*time.Millisecond))
	return e
}

// mountCgroups mounts cgroup v2, which Nomad's task drivers need, in the
// root namespace (n nil) or in a node's mount namespace: `ip netns exec`
// gave each node a fresh /sys without it.
func mountCgroups(t *testing.T, n *guestcluster.Node) {
	script := "grep -q ' /sys/fs/cgroup cgroup2 ' /proc/self/mounts || mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup"
	if n == nil {
		guesttest.Run(t, "sh", "-c", script)
		return
	}
	guesttest.Exec(t, n, script)
}

// prepareNode gives a node what an operator puts on a client: a data
// directory on a tmpfs (busybox df cannot resolve the guest's initramfs
// root) that is a shared mount, as a host's root is (a containerised node
// plugin's mounts reach the client through it), the TLS material, and a
// small chroot for exec tasks (Nomad's default copies /bin, /lib, /usr,
// ... into every task).
// makeCertificates makes the agent port's CA and certificates with
// zfs-controller tls, as docs/install.md tells the operator to: one per
// client (its common name the client's name), the controller's, and an
// operator's for the operator commands.
func (e *e2e) makeCertificates() {
	e.t.Helper()
	e.pki = filepath.Join(e.c.Dir(), "pki")
	ctl := filepath.Join(e.bin, "zfs-controller")
	ca := filepath.Join(e.pki, "ca")
	guesttest.Run(e.t, ctl, "tls", "ca", ca)
	issue := func(role, name string) {
		guesttest.Run(e.t, ctl, "tls", "cert", "-ca", ca, "-role", role, "-out", filepath.Join(e.pki, name), name)
	}
	for _, n := range e.c.Nodes {
		issue(tlsconfig.RoleNode, n.ID)
	}
	issue(tlsconfig.RoleController, "controller")
	issue(tlsconfig.RoleOperator, "operator")
	issue(tlsconfig.RoleBackup, backupTarget)
}

// backupTarget is the name of the backup target startBackupTarget starts.
const backupTarget = "vault"

// startBackupTarget starts a backup target outside the Nomad cluster, on
// the guest's fourth disk, with the certificate makeCertificates made:
// the plugins deployed after it know it (backup_targets), and the
// controller lists its backups as CSI snapshots (backups_as_snapshots).
func (e *e2e) startBackupTarget() {
	e.t.Helper()
	target, err := e.c.StartTarget(backupTarget, guesttest.Disk(3), e.certificate(backupTarget))
	if err != nil {
		e.t.Fatal(err)
	}
	e.target = target
	e.tell("backup target %s listening at %s, outside the Nomad cluster", target.Name, target.Address)
}

// backupFlags are the plugins' flags for the backup target (none without
// one).
func (e *e2e) backupFlags(controller bool) []string {
	if e.target == nil {
		return nil
	}
	flags := []string{"-backup-targets", e.target.Name + "=" + e.target.Address}
	if controller {
		flags = append(flags, "-backups-as-snapshots")
	}
	return flags
}

// certificate returns the files of a certificate makeCertificates made.
func (e *e2e) certificate(name string) tlsconfig.Files {
	return tlsconfig.Files{CA: filepath.Join(e.pki, "ca", "ca.pem"),
		Cert: filepath.Join(e.pki, name, name+".pem"), Key: filepath.Join(e.pki, name, name+"-key.pem")}
}

func (e *e2e) prepareNode(n *guestcluster.Node) {
	e.t.Helper()
	node, ctl := e.certificate(n.ID), e.certificate("controller")
	guesttest.Run(e.t, "mkdir", "-p", nomadDir)
	mountCgroups(e.t, n)
	script := fmt.Sprintf(`set -e
mount -t tmpfs tmpfs %[1]s
mount --make-rshared %[1]s
mkdir -p %[1]s/data %[1]s/tls %[1]s/chroot/bin %[1]s/chroot/etc
cp %[2]s %[1]s/tls/ca.pem
cp %[3]s %[1]s/tls/node.pem
cp %[4]s %[1]s/tls/node-key.pem
cp %[5]s %[1]s/tls/controller.pem
cp %[6]s %[1]s/tls/controller-key.pem
cp /bin/busybox %[1]s/chroot/bin/busybox
for a in sh cat cut date echo head sha256sum sleep sync tr; do ln %[1]s/chroot/bin/busybox %[1]s/chroot/bin/$a; done
cp /etc/passwd /etc/group %[1]s/chroot/etc/
`, nomadDir, node.CA, node.Cert, node.Key, ctl.Cert, ctl.Key)
	guesttest.Exec(e.t, n, script)
}

// serverConfig makes node loss quick to notice and claims of lost
// allocations quick to free (Nomad's defaults take minutes).
func serverConfig(dir string) string {
	return fmt.Sprintf(`name = "server"
data_dir = %q
bind_addr = %q
log_level = "DEBUG"
server {
  enabled = true
  bootstrap_expect = 1
  heartbeat_grace = "3s"
  min_heartbeat_ttl = "3s"
  csi_volume_claim_gc_interval = "5s"
  csi_volume_claim_gc_threshold = "5s"
}
`, filepath.Join(dir, "nomad-server"), serverIP)
}

// clientConfig is one client: the root dataset in its meta (the node job
// reads it there), the flavour's task drivers (docker; or raw_exec, and
// exec without pivot_root, which the guest needed while its root was an
// initramfs and which still works on its tmpfs root), Nomad's own user
// checks (the example job's tasks run as nobody, which owns the volume's
// root: volume.hcl's uid and gid), no cloud fingerprinting, and resource
// use collected every ten seconds instead of every second.
func (e *e2e) clientConfig(n *guestcluster.Node) string {
	return fmt.Sprintf(`name = %[1]q
data_dir = "%[2]s/data"
bind_addr = %[3]q
log_level = "DEBUG"
client {
  enabled = true
  servers = ["%[4]s:4647"]
  # Room for the many-volume drain's eight jobs on one client, whatever
  # the emulated CPU fingerprints.
  cpu_total_compute = 8000
  network_interface = "eth0"
  meta {
    zfs_nomad_root_dataset = %[5]q
%[6]s  }
  chroot_env {
    "%[2]s/chroot/bin" = "/bin"
    "%[2]s/chroot/etc" = "/etc"
  }
  options {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
}
# Every client collects its host's and each task's resource use once a
# second by default. Here three clients share two emulated vCPUs with
# everything the test measures, so they collect every ten seconds.
telemetry {
  collection_interval = "10s"
}
`, n.ID, nomadDir, n.IP, serverIP, n.RootDataset, e.imageMeta()) + e.flavour.driverConfig(n)
}

// plaintextAgents is a diagnostic, never a test of the product: the
// plugins' agent ports (replication among them) run without TLS, to show
// what encrypting every byte on the guest's two emulated vCPUs costs the
// drain (docs/migration.md).
var plaintextAgents = flag.Bool("plaintext-agents", false, "run the agent ports without TLS (-insecure-agent-port): a diagnostic of TLS's cost in this guest")

// agentPortFlags are the flags every plugin and operator command takes
// for the agent port: none, or -insecure-agent-port with -plaintext-agents.
func agentPortFlags() []string {
	if *plaintextAgents {
		return []string{"-insecure-agent-port"}
	}
	return nil
}

// hclList is items as an HCL list of strings.
func hclList(items []string) string {
	quoted := make([]string, len(items))
	for i, item := range items {
		quoted[i] = strconv.Quote(item)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// deployPlugins runs the two plugin jobs and waits until Nomad reports the
// controller and all three nodes healthy.
func (e *e2e) deployPlugins() { e.deployPluginsOn(3) }

// deployPluginsOn is deployPlugins for a cluster where the node job
// places that many node plugins.
func (e *e2e) deployPluginsOn(nodes int) {
	began := time.Now()
	node, controller := e.pluginVars()
	// The docker flavour renders the TLS material from Nomad Variables,
	// raw_exec reads it from files on the clients: both ways the job
	// files offer.
	tls := []string{"-var", "tls_dir=" + nomadDir + "/tls"}
	if e.flavour.docker {
		e.putTLSVariables()
		tls = []string{"-var", "tls_from=variables"}
	}
	nodeRun, controllerRun := e.pluginRuns(node, controller)
	nodeRun = nodeRun.before(slices.Concat([]string{"-detach"}, tls, []string{"-var", "log_level=debug",
		// The shipped lease and margin (30 s each): a failover away
		// from a killed node waits 60 s of silence. Shorter leases
		// lapsed under load here: in the rotation step, with a backup
		// running, the emulated guest's two CPUs left two nodes' peers
		// silent 15 s (docs/testing.md, "The Nomad test's lease").
		"-var", "extra_args=" + hclList(slices.Concat(agentPortFlags(), e.backupFlags(false)))})...)
	controllerRun = controllerRun.before(slices.Concat([]string{"-detach"}, tls, []string{"-var", "log_level=debug",
		// Surplus copies go at once: the many-volume drain checks that
		// the copy a move left of a volume without replicas goes.
		"-var", "extra_args=" + hclList(slices.Concat([]string{"-agent-timeout", "10s", "-surplus-grace", "0s"}, agentPortFlags(), e.backupFlags(true)))})...)
	e.nomad(nodeRun[1:]...)
	e.nomad(controllerRun[1:]...)
	e.waitForPlugins(nodes, "")
	e.tell("FIGURE plugins healthy: %s after job run", time.Since(began).Round(100*time.Millisecond))
	e.waitForChecks("zfs-nomad-node-metrics", nodes)
	e.waitForChecks("zfs-nomad-agent", nodes)
	e.waitForChecks("zfs-nomad-controller-metrics", 2)
	e.tell("FIGURE plugins' service checks passing: %s after job run", time.Since(began).Round(100*time.Millisecond))
}

// setRootDatasetMeta sets a client's zfs_nomad_root_dataset meta with
// `nomad node meta apply` (empty: unsets it) and waits until the servers
// schedule with it (the client batches such changes for up to 10 s).
func (e *e2e) setRootDatasetMeta(n *guestcluster.Node, value string) {
	e.t.Helper()
	const key = "zfs_nomad_root_dataset"
	if value == "" {
		e.nomad("node", "meta", "apply", "-node-id", e.nodeIDs[n.ID], "-unset", key)
	} else {
		e.nomad("node", "meta", "apply", "-node-id", e.nodeIDs[n.ID], key+"="+value)
	}
	e.eventually(time.Minute, fmt.Sprintf("%s's %s meta %q at the servers", n.ID, key, value), func() error {
		var node struct{ Meta map[string]string }
		if err := e.get("/v1/node/"+e.nodeIDs[n.ID], &node); err != nil {
			return err
		}
		if got := node.Meta[key]; got != value {
			return fmt.Errorf("the servers see %q", got)
		}
		return nil
	})
}

// runningAllocations returns the clients where a job has a running
// allocation.
func (e *e2e) runningAllocations(job string) []string {
	e.t.Helper()
	var allocs []struct{ NodeName, ClientStatus string }
	if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	var on []string
	for _, a := range allocs {
		if a.ClientStatus == "running" {
			on = append(on, a.NodeName)
		}
	}
	sort.Strings(on)
	return on
}

// restartTask restarts a job's task on a node with `nomad alloc restart`
// and waits until Nomad reports it running again.
func (e *e2e) restartTask(job, task, node string) {
	e.t.Helper()
	id := e.runningAlloc(job, node)
	before, _, _ := e.taskState(id, task)
	e.nomad("alloc", "restart", id, task)
	e.waitForTaskRestarted(id, task, node, before)
}

// runningAlloc is the ID of a job's running allocation on a node.
func (e *e2e) runningAlloc(job, node string) string {
	e.t.Helper()
	var allocs []struct{ ID, NodeName, ClientStatus string }
	if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	for _, a := range allocs {
		if a.NodeName == node && a.ClientStatus == "running" {
			return a.ID
		}
	}
	e.t.Fatalf("no running allocation of %s on %s: %+v", job, node, allocs)
	return ""
}

// taskState is what Nomad reports of an allocation's task: how often it
// restarted, whether it runs, and its events.
func (e *e2e) taskState(alloc, task string) (restarts int, running bool, events string) {
	e.t.Helper()
	var a struct {
		TaskStates map[string]struct {
			State    string
			Restarts int
			Events   []struct{ Type, DisplayMessage string }
		}
	}
	if err := e.get("/v1/allocation/"+alloc, &a); err != nil {
		e.t.Fatal(err)
	}
	ts := a.TaskStates[task]
	return ts.Restarts, ts.State == "running", fmt.Sprintf("%+v", ts.Events)
}

// waitForTaskRestarted waits until the allocation's task restarted since
// it had restarted before times, and runs.
func (e *e2e) waitForTaskRestarted(alloc, task, node string, before int) {
	e.t.Helper()
	e.eventually(time.Minute, task+" running again on "+node, func() error {
		if n, running, events := e.taskState(alloc, task); n <= before || !running {
			return fmt.Errorf("%s: %d restarts (%d before), running %v; events %s", task, n, before, running, events)
		}
		return nil
	})
}

// pluginVars are the flavour's variables for the node and the controller
// job: the images, or the binaries (and where Nomad's data_dir is, which
// raw_exec's stage_publish_base_dir names).
func (e *e2e) pluginVars() (node, controller []string) {
	if e.flavour.docker {
		return []string{"-var", "image=${meta.zfs_nomad_node_image}"},
			[]string{"-var", "image=" + e.images["zfs-controller.tar"]}
	}
	return []string{"-var", "binary=" + filepath.Join(e.bin, "zfs-node"), "-var", "data_dir=" + nomadDir + "/data"},
		[]string{"-var", "binary=" + filepath.Join(e.bin, "zfs-controller")}
}

// pluginRuns are the command lines that run the plugin jobs: under
// docker the install guide's (its image names' repositories checked
// against the images the test loaded, their tags the test's), under
// raw_exec, which the guide describes in words, the test's own with
// the binaries' and data directory's variables.
func (e *e2e) pluginRuns(node, controller []string) (nodeRun, controllerRun guideLine) {
	if !e.flavour.docker {
		return slices.Concat(guideLine{"nomad", "job", "run"}, node, []string{e.file("zfs-node.nomad.hcl")}),
			slices.Concat(guideLine{"nomad", "job", "run"}, controller, []string{e.file("zfs-controller.nomad.hcl")})
	}
	const controllerRepo = "localhost/zfs-nomad/zfs-controller:"
	if image := e.images["zfs-controller.tar"]; !strings.HasPrefix(image, controllerRepo) {
		e.t.Fatalf("the controller image is %s; the guide names it %sVERSION", image, controllerRepo)
	}
	nodeRun = guideCommand(e.t, "nomad", "job", "run", "image=${meta.zfs_nomad_node_image}", "nomad/zfs-node.nomad.hcl").
		replace(e.t, "nomad/zfs-node.nomad.hcl", e.file("zfs-node.nomad.hcl"))
	controllerRun = guideCommand(e.t, "nomad", "job", "run", "nomad/zfs-controller.nomad.hcl").
		replacePrefix(e.t, "image="+controllerRepo, "image="+e.images["zfs-controller.tar"]).
		replace(e.t, "nomad/zfs-controller.nomad.hcl", e.file("zfs-controller.nomad.hcl"))
	return nodeRun, controllerRun
}

// imageMeta is the client meta naming the client's node image (docker
// flavour): the node job takes its image from there, as install.md tells
// a cluster whose clients run different Debian releases to.
func (e *e2e) imageMeta() string {
	if !e.flavour.docker {
		return ""
	}
	return fmt.Sprintf("    zfs_nomad_node_image = %q\n", e.images["zfs-node.tar"])
}

// counterVars are the example job's variables besides the volume: under
// docker, the node image stands in for busybox (the guest reaches no
// registry; the image has a shell and coreutils).
func (e *e2e) counterVars() []string {
	if e.flavour.docker {
		return []string{"-var", "image=" + e.images["zfs-node.tar"]}
	}
	return nil
}

// waitForChecks waits until service has n registrations whose
// allocations report every check of theirs passing: the job files'
// checks are what their update blocks and an operator's monitoring
// read, so they must pass on a healthy plugin.
func (e *e2e) waitForChecks(service string, n int) {
	e.t.Helper()
	e.eventually(2*time.Minute, fmt.Sprintf("%d registrations of service %s with their checks passing", n, service), func() error {
		var regs []struct{ AllocID string }
		if err := e.get("/v1/service/"+service, &regs); err != nil {
			return err
		}
		if len(regs) != n {
			return fmt.Errorf("%d registrations", len(regs))
		}
		for _, r := range regs {
			var checks map[string]struct{ Status, Output string }
			if err := e.get("/v1/client/allocation/"+r.AllocID+"/checks", &checks); err != nil {
				return err
			}
			if len(checks) == 0 {
				return fmt.Errorf("allocation %s reports no check results yet", r.AllocID)
			}
			for _, c := range checks {
				if c.Status != "success" {
					return fmt.Errorf("allocation %s: a check is %s: %s", r.AllocID, c.Status, c.Output)
				}
			}
		}
		return nil
	})
}

// waitForPlugins waits until Nomad reports a healthy controller plugin on
// a node other than gone (a node drained or killed: a controller that ran
// there is being replaced, and Nomad may still count the old one healthy)
// and at least nodes healthy node plugins. Every step that needs the
// controller (volume and snapshot commands, claims) waits for this after
// a step that may have moved it: where Nomad places the controller is
// Nomad's choice.
func (e *e2e) waitForPlugins(nodes int, gone string) {
	e.t.Helper()
	e.eventually(2*time.Minute, fmt.Sprintf("a healthy controller plugin (not on %q) and %d healthy node plugins", gone, nodes), func() error {
		var p struct {
			Controllers  map[string]struct{ Healthy bool }
			NodesHealthy int
		}
		if err := e.get("/v1/plugin/csi/zfs-nomad", &p); err != nil {
			return err
		}
		var healthy []string
		for id, c := range p.Controllers {
			if c.Healthy && id != e.nodeIDs[gone] {
				healthy = append(healthy, id)
			}
		}
		if len(healthy) == 0 || p.NodesHealthy < nodes {
			return fmt.Errorf("healthy controllers on %v (of %d reported), %d healthy node plugins", healthy, len(p.Controllers), p.NodesHealthy)
		}
		return nil
	})
}

// waitForDrained waits until Nomad reports a node's drain complete: every
// allocation but the system jobs' (the node plugin) has left it,
// including the controller plugin if it ran there.
func (e *e2e) waitForDrained(name string) {
	e.t.Helper()
	e.eventually(3*time.Minute, "the drain of "+name+" complete (Nomad clears the node's DrainStrategy)", func() error {
		var n struct{ DrainStrategy *struct{ Deadline int64 } }
		if err := e.get("/v1/node/"+e.nodeIDs[name], &n); err != nil {
			return err
		}
		if n.DrainStrategy != nil {
			return fmt.Errorf("%s is still draining", name)
		}
		return nil
	})
}

// allocation is a running counter job's allocation and what it reported.
type allocation struct {
	id, node string
	data     string // checksum of data.bin
	allocs   string // the allocations that used the volume, oldest first
}

// runCounter runs nomad/example-job.nomad.hcl on volume and waits until it
// is ready.
func (e *e2e) runCounter(volume string) allocation {
	e.t.Helper()
	run := guideCommand(e.t, "nomad", "job", "run", "nomad/example-job.nomad.hcl").
		replace(e.t, "nomad/example-job.nomad.hcl", e.file("example-job.nomad.hcl")).
		before(append([]string{"-detach", "-var", "volume=" + volume}, e.counterVars()...)...)
	e.nomad(run[1:]...)
	return e.waitForCounter("")
}

var (
	dataLine   = regexp.MustCompile(`(?m)^data\.bin ([0-9a-f]{64})$`)
	allocsLine = regexp.MustCompile(`(?m)^allocs (.*)$`)
)

// waitForCounter waits for a running counter allocation other than
// previous that has printed "ready", and returns what it printed.
func (e *e2e) waitForCounter(previous string) allocation {
	e.t.Helper()
	var a allocation
	e.eventually(3*time.Minute, "the counter job ready", func() error {
		var err error
		a, err = e.readyAllocation("counter", previous)
		return err
	})
	return a
}

// readyAllocation returns what a running allocation of job (a copy of
// nomad/example-job.nomad.hcl) other than previous printed once ready, or
// why there is none yet.
func (e *e2e) readyAllocation(job, previous string) (allocation, error) {
	e.t.Helper()
	var allocs []struct {
		ID, NodeName, ClientStatus, DesiredStatus string
	}
	if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
		return allocation{}, err
	}
	for _, al := range allocs {
		if al.ID == previous || al.ClientStatus != "running" || al.DesiredStatus != "run" {
			continue
		}
		logs, err := e.taskLogs(al.ID, "counter")
		if err != nil || !strings.Contains(logs, "\nready\n") {
			return allocation{}, fmt.Errorf("allocation %s of %s on %s not ready yet: %v %s", al.ID, job, al.NodeName, err, logs)
		}
		d, l := dataLine.FindStringSubmatch(logs), allocsLine.FindStringSubmatch(logs)
		if d == nil || l == nil {
			e.t.Fatalf("allocation %s printed:\n%s", al.ID, logs)
		}
		return allocation{id: al.ID, node: al.NodeName, data: d[1], allocs: strings.TrimSpace(l[1])}, nil
	}
	return allocation{}, fmt.Errorf("no running allocation of %s besides %q: %+v%s", job, previous, allocs, e.placementFailures(job))
}

// placementFailures tells why the scheduler placed none of a job's
// allocations, from its evaluations: "" when it says nothing.
func (e *e2e) placementFailures(job string) string {
	var evals []struct {
		Status         string
		FailedTGAllocs map[string]struct {
			DimensionExhausted map[string]int
			ConstraintFiltered map[string]int
			NodesEvaluated     int
			NodesExhausted     int
		}
	}
	if err := e.get("/v1/job/"+job+"/evaluations", &evals); err != nil {
		return ""
	}
	var out []string
	for _, ev := range evals {
		for group, f := range ev.FailedTGAllocs {
			out = append(out, fmt.Sprintf("group %s not placed: %d nodes evaluated, %d exhausted %v, filtered %v", group, f.NodesEvaluated, f.NodesExhausted, f.DimensionExhausted, f.ConstraintFiltered))
		}
	}
	if len(out) == 0 {
		return ""
	}
	return "; " + strings.Join(out, "; ")
}

// waitForDeployment waits until a job's latest deployment succeeded.
func (e *e2e) waitForDeployment(job string) {
	e.t.Helper()
	e.eventually(time.Minute, job+" deployed", func() error {
		var d struct{ Status string }
		if err := e.get("/v1/job/"+job+"/deployment", &d); err != nil {
			return err
		}
		if d.Status != "successful" {
			return fmt.Errorf("deployment %s", d.Status)
		}
		return nil
	})
}

// runningOn names the nodes of a job's running allocations, sorted.
func (e *e2e) runningOn(job string) []string {
	e.t.Helper()
	var allocs []struct{ NodeName, ClientStatus string }
	if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	var nodes []string
	for _, a := range allocs {
		if a.ClientStatus == "running" {
			nodes = append(nodes, a.NodeName)
		}
	}
	sort.Strings(nodes)
	return nodes
}

// workLeaseHolder names the node whose controller instance holds the
// work lease, as status tells it ("nobody" when none does).
func (e *e2e) workLeaseHolder() string {
	e.t.Helper()
	for _, c := range e.statusReport().Controllers {
		if !c.HoldsWorkLease {
			continue
		}
		host, _, _ := strings.Cut(c.Address, ":")
		for _, n := range e.c.Nodes {
			if n.IP == host {
				return n.ID
			}
		}
		return c.Address
	}
	return "nobody"
}

// controllers says where the controller instances run and which one
// holds the work lease, for a figure's line.
func (e *e2e) controllers() string {
	return fmt.Sprintf("controllers on %s, the work lease's holder on %s", strings.Join(e.runningOn("zfs-nomad-controller"), ","), e.workLeaseHolder())
}

// counterAllocation is a counter allocation's status and task events.
type counterAllocation struct {
	id, node, status string
	events           []string // "Type: message", oldest first
}

func (e *e2e) counterAllocations() []counterAllocation {
	e.t.Helper()
	var allocs []struct {
		ID, NodeName, ClientStatus string
		TaskStates                 map[string]struct {
			Events []struct{ Type, DisplayMessage string }
		}
	}
	if err := e.get("/v1/job/counter/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	var out []counterAllocation
	for _, a := range allocs {
		ca := counterAllocation{id: a.ID, node: a.NodeName, status: a.ClientStatus}
		for _, ev := range a.TaskStates["counter"].Events {
			ca.events = append(ca.events, ev.Type+": "+ev.DisplayMessage)
		}
		out = append(out, ca)
	}
	return out
}

// logFailedAllocations shows why counter allocations failed (the task
// events), to explain the figures.
func (e *e2e) logFailedAllocations() {
	e.t.Helper()
	failed := false
	for _, a := range e.counterAllocations() {
		if a.status == "failed" {
			e.t.Logf("failed allocation %s on %s:\n  %s", a.id, a.node, strings.Join(a.events, "\n  "))
			failed = true
		}
	}
	if failed {
		// What the controller and the nodes did about the moves: a claim
		// that failed waited for a move or its final step.
		e.t.Logf("the plugins' log lines on moves:\n%s", e.pluginLogLines(`move|final step|promot|fence|demot|publish`))
	}
}

// pluginLogLines are the last lines of every plugin task's log (every
// client, every allocation) that match the extended regular expression.
func (e *e2e) pluginLogLines(pattern string) string {
	var b strings.Builder
	for _, n := range e.c.Nodes {
		out, _ := n.Exec(fmt.Sprintf("for f in %s/data/alloc/*/alloc/logs/zfs-*.stderr.*; do grep -E %q $f | grep -v 'level=DEBUG\\|\\[DEBUG\\]' | sed \"s|^|$(basename $f): |\"; done 2>/dev/null | tail -n 60", nomadDir, pattern))
		fmt.Fprintf(&b, "---- %s\n%s", n.ID, out)
	}
	return b.String()
}

// waitForFailedClaim waits until a counter allocation's events tell of a
// refused claim mentioning want, and returns the error.
func (e *e2e) waitForFailedClaim(want string) string {
	e.t.Helper()
	var found string
	e.eventually(3*time.Minute, "a claim refused with "+want, func() error {
		for _, a := range e.counterAllocations() {
			for _, ev := range a.events {
				if i := strings.Index(ev, "rpc error"); i >= 0 && strings.Contains(ev, want) {
					found = ev[i:]
					return nil
				}
			}
		}
		return fmt.Errorf("no allocation event mentions %q", want)
	})
	return found
}

// wantSameData checks that next found exactly the data before left, and
// that every allocation before it used the same volume; and, if moved, that
// next runs on another node.
func (e *e2e) wantSameData(before, next allocation, moved bool) {
	e.t.Helper()
	if moved && next.node == before.node {
		e.t.Errorf("allocation %s runs on %s, where %s ran: it did not move", next.id, next.node, before.id)
	}
	if next.data != before.data {
		e.t.Errorf("data.bin on %s: sha256 %s, want %s (as on %s)", next.node, next.data, before.data, before.node)
	}
	if want := before.allocs + " " + next.id; next.allocs != want {
		e.t.Errorf("allocations recorded on the volume: %q, want %q", next.allocs, want)
	}
	e.tell("the job on %s found data.bin, sha256 %.16s..., as left on %s; allocations that used the volume: %s",
		next.node, next.data, before.node, next.allocs)
}

// snapshotID finds the snapshot of a volume through Nomad's snapshot list
// and checks that the CLI lists it too.
func (e *e2e) snapshotID(volume string) string {
	e.t.Helper()
	source := e.externalID(volume)
	var resp struct {
		Snapshots []struct{ ID, ExternalSourceVolumeID string }
	}
	if err := e.get("/v1/volumes/snapshot?plugin_id=zfs-nomad", &resp); err != nil {
		e.t.Fatal(err)
	}
	out := e.nomad("volume", "snapshot", "list", "-plugin", "zfs-nomad")
	for _, s := range resp.Snapshots {
		if s.ExternalSourceVolumeID != source {
			continue
		}
		if !strings.Contains(out, s.ID) {
			e.t.Fatalf("snapshot %s missing from nomad volume snapshot list:\n%s", s.ID, out)
		}
		return s.ID
	}
	e.t.Fatalf("no snapshot of %s (%s) in %+v", volume, source, resp.Snapshots)
	return ""
}

// externalID is the driver's ID of a Nomad volume.
func (e *e2e) externalID(volume string) string {
	e.t.Helper()
	var v struct{ ExternalID string }
	if err := e.get("/v1/volume/csi/"+volume, &v); err != nil {
		e.t.Fatal(err)
	}
	return v.ExternalID
}

// testPassphrase is the key of the scenario's encrypted volumes, and
// testOwnerSecret their owner secret.
const (
	testPassphrase  = "nomad end to end passphrase"
	testOwnerSecret = "5e2b9c07d1f4a6e38b0c"
)

// withSecrets turns nomad/volume.hcl's commented secrets block on, with
// testOwnerSecret, which Nomad sends with the create and every call on
// the volume after it; when e.encrypt, also its commented encryption
// parameter and the secrets' testPassphrase.
func (e *e2e) withSecrets(spec string) string {
	e.t.Helper()
	const commented = "# secrets {\n#   owner_secret   = \"the output of openssl rand -hex 16\"\n#   encryption_key = \"a passphrase of 8 to 512 characters\"\n# }"
	if !strings.Contains(spec, commented) || !strings.Contains(spec, `  # encryption = "on"`) {
		e.t.Fatal("nomad/volume.hcl no longer has the commented encryption parameter and secrets block: update this test")
	}
	if !e.encrypt {
		return strings.Replace(spec, commented, fmt.Sprintf("secrets {\n  owner_secret = %q\n}", testOwnerSecret), 1)
	}
	return strings.NewReplacer(
		`  # encryption = "on"`, `  encryption = "on"`,
		commented, fmt.Sprintf("secrets {\n  owner_secret   = %q\n  encryption_key = %q\n}", testOwnerSecret, testPassphrase),
	).Replace(spec)
}

// wantKeyLoadedOnlyOn checks that every copy of volume id is encrypted
// and that its key is loaded on node, where the job has it mounted, and
// nowhere else (docs/security.md, "Encrypted volumes"); nothing when the
// scenario's volumes are not encrypted.
func (e *e2e) wantKeyLoadedOnlyOn(id, node string) {
	e.t.Helper()
	if !e.encrypt {
		return
	}
	var copies []string
	for _, n := range e.c.Nodes {
		out, err := guestcluster.Run("zfs", "get", "-H", "-o", "value", "encryption,keystatus", n.RootDataset+"/"+id)
		if err != nil {
			continue // no copy there
		}
		got, want := strings.Fields(out), "available"
		if n.ID != node {
			want = "unavailable"
		}
		if len(got) != 2 || got[0] == "off" || got[1] != want {
			e.t.Fatalf("%s on %s: encryption and key status %q, want encrypted and %s (the job runs on %s)", id, n.ID, got, want, node)
		}
		copies = append(copies, n.ID+" "+got[1])
	}
	e.tell("volume %s is encrypted on every node holding it; its key: %s", id, strings.Join(copies, ", "))
}

// holders lists the nodes holding a dataset of a volume (primary or replica).
func (e *e2e) holders(volumeID string) []string {
	e.t.Helper()
	var out []string
	for _, n := range e.c.Nodes {
		if _, err := guestcluster.Run("zfs", "list", "-H", "-o", "name", n.RootDataset+"/"+volumeID); err == nil {
			out = append(out, n.ID)
		}
	}
	return out
}

// onlyRootDatasets checks that no node holds a dataset besides its root
// and its promise records (guestcluster.DatasetsLeft).
func (e *e2e) onlyRootDatasets() error {
	for _, n := range e.c.Nodes {
		left, err := guestcluster.DatasetsLeft(n.RootDataset)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%s holds:\n%s", n.ID, strings.Join(left, "\n"))
		}
	}
	return nil
}

// backup pushes a volume to its replica now, as an operator would. The
// copy a move demoted, which the schedule removes once the volume's
// other replicas are as fresh, is never its target while another replica
// exists: a backup that chose it failed when the removal came under it.
func (e *e2e) backup(volumeID string) { e.operator("backup", volumeID) }

// operator runs a zfs-controller operator command with the operator's
// certificate against every node's agent.
func (e *e2e) operator(command string, args ...string) {
	e.t.Helper()
	out := guesttest.Run(e.t, filepath.Join(e.bin, "zfs-controller"), e.operatorArgs(command, args...)...)
	e.show("zfs-controller "+command+" "+strings.Join(args, " "), out)
}

// operatorArgs is the command line of a zfs-controller operator command
// with the operator's certificate against every node's agent.
func (e *e2e) operatorArgs(command string, args ...string) []string {
	op := e.certificate("operator")
	argv := append([]string{command, "-peers", strings.Join(e.c.AgentAddresses(), ","),
		"-tls-ca", op.CA, "-tls-cert", op.Cert, "-tls-key", op.Key}, agentPortFlags()...)
	return append(argv, args...)
}

// killNode stops a node hard: its link goes down and every process in it
// (Nomad client, plugins, tasks) is killed, as when a machine dies. The
// process holding its namespaces stays, so its pool stays imported.
func (e *e2e) killNode(name string) {
	e.t.Helper()
	e.tell("%s dies: its link goes down and every process on it (Nomad client, plugins, the job) is killed", name)
	n := e.node(name)
	if err := n.CutLink(); err != nil {
		e.t.Fatal(err)
	}
	e.killEveryProcess(n)
}

// killEveryProcess kills every process of node n, as when its machine
// dies, and waits until none is left.
func (e *e2e) killEveryProcess(n *guestcluster.Node) {
	e.t.Helper()
	e.eventually(10*time.Second, "every process on "+n.ID+" killed", func() error { return killAll(n) })
}

// node is the guest cluster's node of that name.
func (e *e2e) node(name string) *guestcluster.Node {
	e.t.Helper()
	for _, n := range e.c.Nodes {
		if n.ID == name {
			return n
		}
	}
	e.t.Fatalf("no node %s", name)
	return nil
}

// stop ends Nomad and everything it started, before the cluster's pools
// go, and shows the logs if the test failed.
func (e *e2e) stop() {
	if e.t.Failed() {
		e.showLogs()
	}
	for _, n := range e.c.Nodes {
		_ = killAll(n)
	}
	for _, p := range e.procs {
		p.Kill()
	}
}

// killAll kills every process of a node but the one holding its
// namespaces, and reports any left (some may be starting).
func killAll(n *guestcluster.Node) error {
	pids, err := nodeProcesses(n)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if left, err := nodeProcesses(n); err != nil || len(left) > 0 {
		return fmt.Errorf("processes left: %v %v", left, err)
	}
	return nil
}

// nodeProcesses are the processes in a node's network namespace but the
// one holding its namespaces, and all their descendants: a container with
// a network of its own runs under a containerd shim in the node's.
func nodeProcesses(n *guestcluster.Node) ([]int, error) {
	out, err := guestcluster.Run("ip", "netns", "pids", n.Netns)
	if err != nil {
		return nil, err
	}
	var found []int
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid != n.HostPid() {
			found = append(found, pid)
		}
	}
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue // ended meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(fields) < 2 || fields[0] == "Z" {
			continue // a zombie is dead already
		}
		pid, err1 := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		ppid, err2 := strconv.Atoi(fields[1])
		if err1 == nil && err2 == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	for i := 0; i < len(found); i++ {
		found = append(found, children[found[i]]...)
	}
	return found, nil
}

// killCommand kills a node's processes that run command, and says how
// many it killed.
func killCommand(n *guestcluster.Node, command string) int {
	pids, _ := nodeProcesses(n)
	killed := 0
	for _, pid := range pids {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == command {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
			}
		}
	}
	return killed
}

// taskProcesses are a node's processes of the Nomad allocation allocID:
// those whose environment names it, as Nomad sets NOMAD_ALLOC_ID in every
// task's.
func taskProcesses(n *guestcluster.Node, allocID string) []int {
	pids, _ := nodeProcesses(n)
	var found []int
	for _, pid := range pids {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err == nil && slices.Contains(strings.Split(string(env), "\x00"), "NOMAD_ALLOC_ID="+allocID) {
			found = append(found, pid)
		}
	}
	return found
}

func (e *e2e) showLogs() {
	for _, p := range e.procs {
		if data, err := os.ReadFile(p.Log); err == nil {
			e.t.Logf("---- log of %s ----\n%s", p.Name, tail(string(data), 60))
		}
	}
	for _, n := range e.c.Nodes {
		out, _ := n.Exec(fmt.Sprintf("for f in %s/data/alloc/*/alloc/logs/*; do echo \"---- $f\"; tail -n 60 $f; done", nomadDir))
		e.t.Logf("---- task logs on %s ----\n%s", n.ID, out)
	}
	// Which processes' mount namespaces hold a ZFS mount, and the
	// datasets' holds: what a "dataset is busy" needs explained.
	out, _ := guestcluster.Run("sh", "-c", `for p in /proc/[0-9]*; do m=$(grep ' - zfs ' $p/mountinfo 2>/dev/null | awk '{print $5, $(NF-1)}'); [ -n "$m" ] && echo "pid ${p#/proc/} $(cat $p/comm) mnt $(readlink $p/ns/mnt): $m"; done | sort -k5 | uniq -f4 -c; zfs list -H -t all -o name,mounted,userrefs; true`)
	e.t.Logf("---- ZFS mounts by mount namespace, and holds ----\n%s", out)
}

// taskLogCount counts the lines of a task's logs on a node that contain
// want.
func (e *e2e) taskLogCount(node, task, want string) (int, error) {
	for _, n := range e.c.Nodes {
		if n.ID != node {
			continue
		}
		out, err := n.Exec(fmt.Sprintf("cat %s/data/alloc/*/alloc/logs/%s.std*", nomadDir, task))
		if err != nil {
			return 0, fmt.Errorf("reading the %s logs on %s: %v", task, node, err)
		}
		return strings.Count(out, want), nil
	}
	return 0, fmt.Errorf("no node %s", node)
}

func tail(s string, lines int) string {
	parts := strings.Split(s, "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// nomad runs the Nomad CLI against the server and fails the test if it
// fails.
func (e *e2e) nomad(args ...string) string {
	e.t.Helper()
	out, err := e.run(args...)
	e.show("nomad "+strings.Join(args, " "), out)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// show tells a command and its output when narrating, with the test's
// directories left out of paths.
func (e *e2e) show(command, out string) {
	if !*narrate {
		return
	}
	short := strings.NewReplacer(e.repo+"/", "", e.c.Dir()+"/", "", e.bin+"/", "")
	fmt.Printf("   $ %s\n", short.Replace(command))
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.TrimSpace(line) != "" {
			fmt.Printf("     %s\n", line)
		}
	}
}

// createVolume runs nomad volume create with the volume file spec, as an
// operator would: again while Nomad counts no healthy controller (its
// plugin's probe timed out on a loaded guest, or the controller is being
// placed after a drain), for up to two minutes; any other error fails.
func (e *e2e) createVolume(spec string) {
	e.t.Helper()
	create := guideCommand(e.t, "nomad", "volume", "create").replace(e.t, "nomad/volume.hcl", spec)
	e.eventually(2*time.Minute, "nomad volume create "+filepath.Base(spec), func() error {
		out, err := e.run(create[1:]...)
		e.show("nomad volume create "+spec, out)
		// Both pass once the controllers settle after a drain moved one:
		// Nomad asks the first controller of the plugin, in map order,
		// whether it creates volumes (CSIPlugin.HasControllerCapability),
		// healthy or not, and one that is not may carry no ControllerInfo
		// ("plugin does not support creating volumes", 2026-12-06, right
		// after the many-volume drain's drain without volumes).
		if err != nil && !strings.Contains(out, "no healthy controllers") && !strings.Contains(out, "plugin does not support creating volumes") {
			e.t.Fatal(err)
		}
		return err
	})
}

func (e *e2e) run(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(e.bin, "nomad"), args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+apiAddr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nomad %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// taskLogs reads what a task of an allocation printed so far, from the
// HTTP API (what `nomad alloc logs` shows): polled every second while
// jobs start, a nomad process per poll took 15% of the guest's CPU during
// a drain (docs/migration.md), beside what the drain measures.
func (e *e2e) taskLogs(allocID, task string) (string, error) {
	q := url.Values{"task": {task}, "type": {"stdout"}, "origin": {"start"}, "offset": {"0"}, "plain": {"true"}}
	resp, err := http.Get(apiAddr + "/v1/client/fs/logs/" + url.PathEscape(allocID) + "?" + q.Encode())
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("logs of %s/%s: %s: %s", allocID, task, resp.Status, body)
	}
	return string(body), nil
}

// get reads a Nomad HTTP API path into out.
func (e *e2e) get(path string, out any) error { return getJSON(apiAddr+path, out) }

// getJSON decodes the JSON answer of a GET of url into out.
func getJSON(url string, out any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// eventually retries fn until it succeeds or the time is up.
func (e *e2e) eventually(limit time.Duration, what string, fn func() error) {
	e.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(time.Second)
	}
}

// file is a file of nomad/, as users get it.
// file is a file of nomad/: a job file of the flavour's directory, or
// volume.hcl, which every flavour shares.
func (e *e2e) file(name string) string {
	if strings.HasSuffix(name, ".nomad.hcl") {
		return filepath.Join(e.repo, "nomad", e.flavour.jobDir, name)
	}
	return filepath.Join(e.repo, "nomad", name)
}

func (e *e2e) writeFile(name, data string) string {
	e.t.Helper()
	path := filepath.Join(e.c.Dir(), name)
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		e.t.Fatal(err)
	}
	return path
}

func (e *e2e) readFile(path string) string {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(data)
}
