// Package cmdline is both binaries' command line: hashicorp/cli's, as
// Nomad's is, for the dispatch of nested commands (tls ca), -h anywhere
// on the line, -version and shell completion (-autocomplete-install).
// Three things the library does not do are done first: running the
// serving command when a CO starts a plugin with flags only or none,
// help COMMAND, and exit status 2 with a sentence for an unknown command,
// as for any wrong command line (docs/config.md, "Exit status").
package cmdline

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/hashicorp/cli"
	"github.com/posener/complete"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// Command is one command of a program: Run parses args (its flags
// print the usage on UsageOutput on -h) and does the work.
type Command struct {
	Name, Args, Summary string
	Run                 func(args []string) error
}

// UsageOutput is where a command's flags print its usage on -h: stderr
// at a terminal, a buffer when the library asks the command for its
// help. The flag sets of both binaries write there.
var UsageOutput io.Writer = os.Stderr

// LibraryFlags are the library's own flags before a command.
var LibraryFlags = []string{"-h", "-help", "--help", "-v", "-version", "--version",
	"-autocomplete-install", "--autocomplete-install", "-autocomplete-uninstall", "--autocomplete-uninstall"}

// Program is a binary's command line.
type Program struct {
	Name     string
	Version  string // the line -version prints
	Commands []Command
	// Serve is the command a CO runs: the one run when the first
	// argument is a flag, or when there is none and ServeWithoutArgs
	// says so (without it, no arguments list the commands and exit 2).
	Serve            string
	ServeWithoutArgs func() bool
	// Footer is printed below the list of commands.
	Footer string
	// ExitCode turns a command's error into its exit status and reports
	// it on stderr.
	ExitCode       func(err error, stderr io.Writer) int
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// Run runs the command line args and returns the exit status.
func (p Program) Run(args []string) int {
	switch {
	case p.Getenv("COMP_LINE") != "":
		// The shell asks for completions: the library answers.
	case len(args) == 0 && p.ServeWithoutArgs != nil && p.ServeWithoutArgs():
		return p.run(p.Serve, args)
	case len(args) == 0:
		fmt.Fprintln(p.Stderr, p.commandList())
		return p.ExitCode(fmt.Errorf("%w: no command given", config.ErrUsage), p.Stderr)
	case args[0] == "help" && len(args) > 1:
		args = []string{args[1], "-h"}
	case args[0] == "help":
		args = []string{"-h"}
	case strings.HasPrefix(args[0], "-") && !slices.Contains(LibraryFlags, args[0]):
		return p.run(p.Serve, args)
	case !strings.HasPrefix(args[0], "-") && !p.isCommand(args[0]):
		return p.ExitCode(fmt.Errorf("%w: unknown command %q; %s -h lists the commands", config.ErrUsage, args[0], p.Name), p.Stderr)
	}
	c := &cli.CLI{
		Name:         p.Name,
		Version:      p.Version,
		Args:         args,
		Commands:     p.factories(),
		HelpFunc:     func(map[string]cli.CommandFactory) string { return p.commandList() },
		HelpWriter:   p.Stdout,
		ErrorWriter:  p.Stderr,
		Autocomplete: true,
	}
	code, err := c.Run()
	if err != nil {
		fmt.Fprintf(p.Stderr, "%s: %v\n", p.Name, err)
		return 1
	}
	return code
}

// run runs the command named name.
func (p Program) run(name string, args []string) int {
	for _, c := range p.Commands {
		if c.Name == name {
			return p.ExitCode(c.Run(args), p.Stderr)
		}
	}
	return p.ExitCode(fmt.Errorf("%w: no command %q", config.ErrUsage, name), p.Stderr)
}

func (p Program) isCommand(name string) bool {
	return slices.ContainsFunc(p.Commands, func(c Command) bool {
		first, _, _ := strings.Cut(c.Name, " ")
		return first == name
	})
}

// commandList is the help without a command: the top-level commands.
func (p Program) commandList() string {
	width := 0
	for _, c := range p.Commands {
		width = max(width, len(c.Name))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s COMMAND [flags] [arguments]\n\nCommands:\n", p.Name)
	for _, c := range p.Commands {
		if !strings.Contains(c.Name, " ") {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, c.Name, c.Summary)
		}
	}
	fmt.Fprintf(&b, "\n%s\n%s -autocomplete-install adds completion of commands and flags to bash, zsh or fish.", p.Footer, p.Name)
	return b.String()
}

func (p Program) factories() map[string]cli.CommandFactory {
	out := map[string]cli.CommandFactory{}
	for _, c := range p.Commands {
		out[c.Name] = func() (cli.Command, error) { return libraryCommand{c: c, p: p}, nil }
	}
	return out
}

// libraryCommand is a command as the library runs it.
type libraryCommand struct {
	c Command
	p Program
}

func (x libraryCommand) Synopsis() string { return x.c.Summary }

func (x libraryCommand) Run(args []string) int { return x.p.ExitCode(x.c.Run(args), x.p.Stderr) }

// Help is what the command's flags print on -h: its usage line, summary
// and flags, from the one flag set that parses them.
func (x libraryCommand) Help() string { return Help(x.c) }

// Help is the usage a command prints on -h.
func Help(c Command) string {
	var b strings.Builder
	UsageOutput = &b
	defer func() { UsageOutput = os.Stderr }()
	_ = c.Run([]string{"-h"})
	return strings.TrimRight(b.String(), "\n")
}

// AutocompleteFlags completes the flags Help lists: paths for those that
// name a file or a directory, nothing for the others.
func (x libraryCommand) AutocompleteFlags() complete.Flags { return Flags(x.c) }

// Flags are the flags a command's help lists, each with what completes
// its value.
func Flags(c Command) complete.Flags {
	flags := complete.Flags{}
	for _, line := range strings.Split(Help(c), "\n") {
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

// AutocompleteArgs completes a directory for tls ca, whose argument is
// one, and nothing for the others, whose arguments are volumes and
// backups the cluster knows.
func (x libraryCommand) AutocompleteArgs() complete.Predictor {
	if x.c.Name == "tls ca" {
		return complete.PredictDirs("*")
	}
	return complete.PredictNothing
}

// Usage is the usage line and summary of command c of binary name,
// above its flags in -h.
func Usage(name string, c Command) string {
	return fmt.Sprintf("usage: %s %s %s\n\n%s.", name, c.Name, c.Args, c.Summary)
}
