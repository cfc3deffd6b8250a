package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/libzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/csiplugin"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
)

// command is one of zfs-node's commands, as zfs-controller's.
type command struct {
	name, args, summary string
	run                 func(args []string, stdout io.Writer) error
}

var commands = []command{
	{"serve", "[flags]", "Serve the CSI Identity and Node services and the node agent: what Nomad runs (the command when the first argument is a flag)",
		func(args []string, _ io.Writer) error { return serve(args) }},
	{"target", "[flags]", "Serve as a backup target: keep the backups nodes push, pruned by each volume's grid; no Nomad, CSI or peers (docs/backups.md)",
		func(args []string, _ io.Writer) error { return serveTarget(args) }},
	{"check-config", "[flags]", "Check a configuration (file, environment, flags) and its TLS files as serve would, without ZFS", checkConfig},
	{"version", "", "Print the version, the agent protocol and the OpenZFS release the binary is built for", printVersion},
}

// main exits 0 when done or after -h, 2 on a wrong command line (as
// zfs-controller), 1 on a failure.
func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return
	case errors.Is(err, config.ErrUsage):
		fmt.Fprintln(os.Stderr, "zfs-node:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "zfs-node:", err)
		os.Exit(1)
	}
}

// run picks the command; without one (no arguments, or flags first) it
// serves, as Nomad's job files of earlier releases run it.
func run(args []string, stdout io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		switch {
		case len(args) == 1 && (args[0] == "-version" || args[0] == "--version"):
			return printVersion(nil, stdout)
		case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
			printCommands(stdout)
			return nil
		}
		return serve(args)
	}
	if args[0] == "help" {
		printCommands(stdout)
		return nil
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:], stdout)
		}
	}
	return fmt.Errorf("%w: unknown command %q; zfs-node -h lists the commands", config.ErrUsage, args[0])
}

func printCommands(out io.Writer) {
	fmt.Fprintf(out, "usage: zfs-node COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(out, "  %-13s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(out, "\nzfs-node serve -h lists the flags; docs/config.md the configuration.\n")
}

func printVersion(args []string, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%w: version takes no arguments", config.ErrUsage)
	}
	fmt.Fprintf(stdout, "zfs-node %s (agent protocol %d, built for OpenZFS %s, libzfs binding %s)\n",
		version.Version, protocol.Version, cmp.Or(openzfs.BuiltFor, "unknown"), libzfs.Binding)
	return nil
}

// checkConfig loads the configuration as serve does and opens its TLS
// files with serve's checks (the node's name, role, CA and validity), and
// says what it found: an operator runs it before a restart, a job's
// prestart task before the plugin.
func checkConfig(args []string, stdout io.Writer) error {
	cfg, err := config.LoadNode(args, os.Getenv, os.Stderr)
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
