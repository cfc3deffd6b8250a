package main

import (
	"fmt"
	"io"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
)

// run runs the command line args (package cmdline) and returns the exit
// status. Without arguments it serves when the environment configures a
// server (a CO sets CSI_ENDPOINT for its plugins), and lists the
// commands otherwise.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	p := cmdline.Program{
		Name:     "zfs-controller",
		Version:  versionLine(),
		Commands: libraryCommands(),
		Serve:    "serve",
		ServeWithoutArgs: func() bool {
			return getenv("CSI_ENDPOINT") != "" || getenv(config.EnvPrefix+"CONFIG") != ""
		},
		Footer:   "zfs-controller COMMAND -h shows a command's usage and flags; docs/config.md the configuration.",
		ExitCode: exitCode,
		Stdout:   stdout,
		Stderr:   stderr,
		Getenv:   getenv,
	}
	return p.Run(args)
}

// libraryCommands are the commands as package cmdline runs them.
func libraryCommands() []cmdline.Command {
	var out []cmdline.Command
	for _, c := range commands {
		out = append(out, libraryCommand(c))
	}
	return out
}

func libraryCommand(c command) cmdline.Command {
	return cmdline.Command{Name: c.name, Args: c.args, Summary: c.summary, Run: func(args []string) error { return c.run(c, args) }}
}

func versionLine() string {
	return fmt.Sprintf("zfs-controller %s (agent protocol %d)", version.Version, protocol.Version)
}
