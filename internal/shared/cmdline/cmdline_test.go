package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// TestProgramDispatches: a program serves when a CO starts it with flags
// or none, runs nested commands, answers -h anywhere and help COMMAND
// with the command's own flags, and exits 2 naming an unknown command.
func TestProgramDispatches(t *testing.T) {
	var ran []string
	cmd := func(name string) Command {
		return Command{Name: name, Args: "[flags]", Summary: "Do " + name, Run: func(args []string) error {
			fs := flag.NewFlagSet(name, flag.ContinueOnError)
			fs.SetOutput(UsageOutput)
			fs.Bool("loud", false, "say more")
			fs.Usage = func() {
				fmt.Fprintf(fs.Output(), "%s\n\nFlags:\n", Usage("prog", Command{Name: name, Args: "[flags]", Summary: "Do " + name}))
				fs.PrintDefaults()
			}
			if _, err := config.ParseArgs(fs, args); err != nil {
				return err
			}
			ran = append(ran, name+" "+strings.Join(args, " "))
			return nil
		}}
	}
	exit := func(err error, stderr io.Writer) int {
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, config.ErrUsage):
			fmt.Fprintln(stderr, err)
			return 2
		}
		fmt.Fprintln(stderr, err)
		return 1
	}
	for _, tc := range []struct {
		args         string
		serveWithout bool
		code         int
		ran, printed string
	}{
		{"", true, 0, "serve ", ""},
		{"", false, 2, "", "no command given"},
		{"-loud", false, 0, "serve -loud", ""},
		{"tls ca -loud x", false, 0, "tls ca -loud x", ""},
		{"tls ca x -h", false, 0, "", "usage: prog tls ca [flags]"},
		{"help tls ca", false, 0, "", "-loud"},
		{"-h", false, 0, "", "tls"},
		{"bogus", false, 2, "", `unknown command "bogus"; prog -h lists the commands`},
		{"serve -quiet", false, 2, "", "-quiet"},
	} {
		ran = nil
		var stdout, stderr strings.Builder
		p := Program{Name: "prog", Version: "prog 1", Commands: []Command{cmd("serve"), cmd("tls"), cmd("tls ca")}, Serve: "serve",
			ServeWithoutArgs: func() bool { return tc.serveWithout }, ExitCode: exit, Stdout: &stdout, Stderr: &stderr,
			Getenv: func(string) string { return "" }}
		code := p.Run(strings.Fields(tc.args))
		printed := stdout.String() + stderr.String()
		if code != tc.code || strings.Join(ran, ";") != tc.ran || !strings.Contains(printed, tc.printed) {
			t.Errorf("prog %s: exit %d, ran %q, printed %q; want exit %d, ran %q, printed %q", tc.args, code, ran, printed, tc.code, tc.ran, tc.printed)
		}
	}
}
