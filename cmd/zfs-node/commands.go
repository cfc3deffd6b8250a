package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/libzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
)

// commands are zfs-node's commands, writing what they print on stdout.
func commands(stdout io.Writer) []cmdline.Command {
	return []cmdline.Command{
		{Name: "serve", Args: "[flags]", Summary: "Serve the CSI Identity and Node services and the node agent: what Nomad runs (the command when the first argument is a flag, or there is none)",
			Run: serve},
		{Name: "target", Args: "[flags]", Summary: "Serve as a backup target: keep the backups nodes push, pruned by each volume's grid; no Nomad, CSI or peers (docs/backups.md)",
			Run: serveTarget},
		{Name: "check-config", Args: "[flags]", Summary: "Check a configuration (file, environment, flags) and its TLS files as serve would, without ZFS",
			Run: func(args []string) error { return checkConfig(args, stdout) }},
		{Name: "version", Summary: "Print the version, the agent protocol and the OpenZFS release the binary is built for",
			Run: func(args []string) error { return printVersion(args, stdout) }},
	}
}

// main exits 0 when done or after -h, 2 on a wrong command line (as
// zfs-controller), 1 on a failure.
func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line (package cmdline); without a command (no
// arguments, or flags first) it serves, as Nomad's job files of earlier
// releases run it.
func run(args []string, stdout, stderr io.Writer) int {
	p := cmdline.Program{
		Name:             "zfs-node",
		Version:          versionLine(),
		Commands:         commands(stdout),
		Serve:            "serve",
		ServeWithoutArgs: func() bool { return true },
		Footer:           "zfs-node COMMAND -h shows a command's usage and flags; docs/config.md the configuration.",
		ExitCode:         exitCode,
		Stdout:           stdout,
		Stderr:           stderr,
		Getenv:           os.Getenv,
	}
	return p.Run(args)
}

// exitCode reports err on stderr and turns it into the exit status.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, config.ErrUsage):
		fmt.Fprintln(stderr, "zfs-node:", err)
		return 2
	default:
		fmt.Fprintln(stderr, "zfs-node:", err)
		return 1
	}
}

func versionLine() string {
	return fmt.Sprintf("zfs-node %s (agent protocol %d, built for OpenZFS %s, libzfs binding %s)",
		version.Version, protocol.Version, cmp.Or(openzfs.BuiltFor, "unknown"), libzfs.Binding)
}

// printVersion prints the version line; it takes no flags.
func printVersion(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("zfs-node version", flag.ContinueOnError)
	fs.SetOutput(cmdline.UsageOutput)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: zfs-node version\n\nPrint the version, the agent protocol and the OpenZFS release the binary is built for.")
	}
	rest, err := config.ParseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("%w: version takes no arguments", config.ErrUsage)
	}
	fmt.Fprintln(stdout, versionLine())
	return nil
}

// checkConfig loads the configuration as serve does and opens its TLS
// files with serve's checks (the node's name, role, CA and validity), and
// says what it found: an operator runs it before a restart, a job's
// prestart task before the plugin.
func checkConfig(args []string, stdout io.Writer) error {
	cfg, err := config.LoadNode(args, os.Getenv, cmdline.UsageOutput)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "node %s: root dataset %s, volumes up to %s, domain %s\n", cfg.NodeID, cfg.RootDataset, cfg.MaxQuota, cfg.Domain)
	if cfg.InsecureAgentPort {
		fmt.Fprintln(stdout, "agent port WITHOUT TLS (insecure_agent_port): for a closed test network only")
		return nil
	}
	src, err := csiplugin.OpenTLS(cfg.TLS, tlsconfig.Identity{Roles: []string{tlsconfig.RoleNode}, Name: cfg.NodeID}, hclog.NewNullLogger())
	if err != nil {
		return err
	}
	cert := src.Certificate()
	fmt.Fprintf(stdout, "TLS: %s names node %s, valid until %s\n", cfg.TLS.Cert, cert.Subject.CommonName, cert.NotAfter.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintln(stdout, "the configuration is valid")
	return nil
}
