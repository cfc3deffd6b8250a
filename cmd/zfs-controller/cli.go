package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/cli"
	"github.com/posener/complete"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/protocol"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/version"
)

// The command line is hashicorp/cli's, as Nomad's is: its dispatch of
// nested commands (tls ca), -h anywhere on the line, -version and shell
// completion (-autocomplete-install). Three things it does not do are
// done here first: serving when a CO starts the plugin with flags only
// or none (unless the shell asks for completions, COMP_LINE), help
// COMMAND, and exit status 2 with a sentence for an
// unknown command, as for any wrong command line (docs/config.md,
// "Exit status").

// usageOutput is where a command's flags print its usage on -h: stderr
// at a terminal, a buffer when the library asks the command for its help.
var usageOutput io.Writer = os.Stderr

// cliFlags are the library's own flags before a command.
var cliFlags = []string{"-h", "-help", "--help", "-v", "-version", "--version",
	"-autocomplete-install", "--autocomplete-install", "-autocomplete-uninstall", "--autocomplete-uninstall"}

// run runs the command line args and returns the exit status.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	switch {
	case getenv("COMP_LINE") != "":
		// The shell asks for completions: the library answers.
	case len(args) == 0 && (getenv("CSI_ENDPOINT") != "" || getenv(config.EnvPrefix+"CONFIG") != ""):
		// A CO starts its plugins with no command.
		return exitCode(serve(commands[0], args), stderr)
	case len(args) == 0:
		fmt.Fprintln(stderr, commandList())
		return exitCode(fmt.Errorf("%w: no command given", config.ErrUsage), stderr)
	case args[0] == "help" && len(args) > 1:
		args = []string{args[1], "-h"}
	case args[0] == "help":
		args = []string{"-h"}
	case strings.HasPrefix(args[0], "-") && !slices.Contains(cliFlags, args[0]):
		return exitCode(serve(commands[0], args), stderr)
	case !strings.HasPrefix(args[0], "-") && !isCommand(args[0]):
		return exitCode(fmt.Errorf("%w: unknown command %q; zfs-controller -h lists the commands", config.ErrUsage, args[0]), stderr)
	}
	c := &cli.CLI{
		Name:         "zfs-controller",
		Version:      versionLine(),
		Args:         args,
		Commands:     factories(stderr),
		HelpFunc:     func(map[string]cli.CommandFactory) string { return commandList() },
		HelpWriter:   stdout,
		ErrorWriter:  stderr,
		Autocomplete: true,
	}
	code, err := c.Run()
	if err != nil {
		fmt.Fprintln(stderr, "zfs-controller:", err)
		return 1
	}
	return code
}

func versionLine() string {
	return fmt.Sprintf("zfs-controller %s (agent protocol %d)", version.Version, protocol.Version)
}

func isCommand(name string) bool {
	return slices.ContainsFunc(commands, func(c command) bool {
		first, _, _ := strings.Cut(c.name, " ")
		return first == name
	})
}

// commandList is the help without a command: the top-level commands.
func commandList() string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: zfs-controller COMMAND [flags] [arguments]\n\nCommands:\n")
	for _, c := range commands {
		if !strings.Contains(c.name, " ") {
			fmt.Fprintf(&b, "  %-15s %s\n", c.name, c.summary)
		}
	}
	fmt.Fprintf(&b, "\nzfs-controller COMMAND -h shows a command's usage and flags; docs/config.md the configuration.\n")
	fmt.Fprintf(&b, "zfs-controller -autocomplete-install adds completion of commands and flags to bash, zsh or fish.")
	return b.String()
}

func factories(stderr io.Writer) map[string]cli.CommandFactory {
	out := map[string]cli.CommandFactory{}
	for _, c := range commands {
		out[c.name] = func() (cli.Command, error) { return cliCommand{c: c, stderr: stderr}, nil }
	}
	return out
}

// cliCommand is a command as the library runs it.
type cliCommand struct {
	c      command
	stderr io.Writer
}

func (x cliCommand) Synopsis() string { return x.c.summary }

func (x cliCommand) Run(args []string) int { return exitCode(x.c.run(x.c, args), x.stderr) }

// Help is what the command's flags print on -h: its usage line, summary
// and flags, from the one flag set that parses them.
func (x cliCommand) Help() string {
	var b strings.Builder
	usageOutput = &b
	defer func() { usageOutput = os.Stderr }()
	_ = x.c.run(x.c, []string{"-h"})
	return strings.TrimRight(b.String(), "\n")
}

// AutocompleteFlags completes the flags Help lists: paths for those that
// name a file or a directory, nothing to complete for the others.
func (x cliCommand) AutocompleteFlags() complete.Flags {
	flags := complete.Flags{}
	for _, line := range strings.Split(x.Help(), "\n") {
		rest, ok := strings.CutPrefix(line, "  -")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		name := "-" + fields[0]
		switch {
		case len(fields) == 1: // a boolean flag takes no value
			flags[name] = complete.PredictNothing
		case namesAPath(fields[0]):
			flags[name] = complete.PredictFiles("*")
		default:
			flags[name] = complete.PredictAnything
		}
	}
	return flags
}

func namesAPath(flag string) bool {
	return slices.Contains([]string{"config", "ca", "out", "tls-ca", "tls-cert", "tls-key"}, flag) || strings.HasSuffix(flag, "-file")
}

// AutocompleteArgs completes a directory for the tls commands, whose
// arguments are one, and nothing for the others, whose arguments are
// volumes and backups the cluster knows.
func (x cliCommand) AutocompleteArgs() complete.Predictor {
	if x.c.name == "tls ca" {
		return complete.PredictDirs("*")
	}
	return complete.PredictNothing
}
