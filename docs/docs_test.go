// Package docs holds the project's documentation (no Go code): its test
// holds the README and the docs to the commands, flags, make targets and
// files they name, so that a reader who types what they say finds it.
package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
)

// binaries are the commands the docs show, and their packages.
var binaries = map[string]string{
	"zfs-controller": "../cmd/zfs-controller",
	"zfs-node":       "../cmd/zfs-node",
}

var (
	fence      = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	mdLink     = regexp.MustCompile(`\]\(([^)#\s]+)(#[^)\s]*)?\)`)
	// flagLine is a flag in a FlagSet's -h output.
	flagLine = regexp.MustCompile(`(?m)^\s+-(\S+)`)
	// commandLine is a command in a binary's -h list.
	commandLine = regexp.MustCompile(`(?m)^  (\S+)\s{2,}`)
	// separators split a shell line into commands.
	separators = regexp.MustCompile(`\$\(|&&|\|\||[|;()]`)
	// placeholder is an argument a reader replaces or an optional part.
	placeholder = regexp.MustCompile(`^[A-Z][A-Z_0-9]*$|^[\[<{]|\.\.\.`)
	// repoPath is a path in the repository as the docs write one.
	repoPath = regexp.MustCompile(`^(cmd|internal|docs|nomad|hack|guest|monitoring|docker|proto|test|demo)/[A-Za-z0-9_./*-]*$`)
	// makeTarget is a target the Makefile defines.
	makeTarget = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`)
)

// sources are the documents a reader follows.
func sources(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, f := range append(files, "../README.md") {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[f] = string(data)
	}
	return docs
}

// nomadsSource is what the docs write before a path of Nomad's own
// source tree, which is not a path of this repository.
var nomadsSource = regexp.MustCompile(`Nomad's $|Nomad 1\.[0-9.]+, $`)

// codeOf returns a document's code: each line of its fenced blocks
// without its shell comment (a backslash-continued line is one line), and
// its inline spans but those that name Nomad's source.
func codeOf(doc string) []string {
	var code []string
	for _, m := range fence.FindAllStringSubmatch(doc, -1) {
		for _, line := range strings.Split(strings.ReplaceAll(m[1], "\\\n", " "), "\n") {
			if i := strings.Index(" "+line, " #"); i >= 0 {
				line = strings.TrimRight(line[:i], " ")
			}
			code = append(code, line)
		}
	}
	prose := fence.ReplaceAllString(doc, "")
	for _, m := range inlineCode.FindAllStringSubmatchIndex(prose, -1) {
		if before := strings.ReplaceAll(prose[max(0, m[0]-20):m[0]], "\n", " "); !nomadsSource.MatchString(before) {
			code = append(code, prose[m[2]:m[3]])
		}
	}
	return code
}

// commandsIn returns the commands of a code line: its parts between
// shell separators, each without the environment assignments, prompt or
// sudo before it.
func commandsIn(line string) [][]string {
	var out [][]string
	for _, part := range separators.Split(line, -1) {
		words := strings.Fields(part)
		for len(words) > 0 && (words[0] == "$" || words[0] == "#" || words[0] == "sudo" || words[0] == "exec" ||
			strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-")) {
			words = words[1:]
		}
		if len(words) > 0 {
			out = append(out, words)
		}
	}
	return out
}

// cli is what a binary's -h and each command's -h say.
type cli struct {
	commands map[string]bool
	flags    map[string]map[string]bool // by command ("serve" for flags first)
	version  bool                       // --version alone prints the version
}

// helpOf runs bin with args and returns what it printed.
func helpOf(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("usage")) {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return string(out)
}

func flagsIn(help string) map[string]bool {
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	return flags
}

// tlsCommands reads the tls commands from tls's usage line: "usage:
// zfs-controller tls ca [-days N] DIR | cert ... | issue ...".
func tlsCommands(help string) []string {
	line, _, _ := strings.Cut(help, "\n")
	_, usage, _ := strings.Cut(line, "zfs-controller tls ")
	var subs []string
	for _, part := range strings.Split(usage, " | ") {
		if words := strings.Fields(part); len(words) > 0 && !strings.HasPrefix(words[0], "-") {
			subs = append(subs, words[0])
		}
	}
	return subs
}

// build builds the binaries and reads their commands and flags.
func build(t *testing.T) map[string]cli {
	t.Helper()
	dir := t.TempDir()
	clis := map[string]cli{}
	for name, pkg := range binaries {
		bin := filepath.Join(dir, name)
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", name, err, out)
		}
		c := cli{commands: map[string]bool{}, flags: map[string]map[string]bool{}}
		for _, m := range commandLine.FindAllStringSubmatch(helpOf(t, bin, "-h"), -1) {
			if !strings.HasPrefix(m[1], "-") {
				c.commands[m[1]] = true
			}
		}
		_, err := exec.Command(bin, "--version").Output()
		c.version = err == nil
		if !c.commands["serve"] {
			t.Fatalf("%s -h lists no serve command: the parse of its help is wrong", name)
		}
		for cmd := range c.commands {
			c.flags[cmd] = flagsIn(helpOf(t, bin, cmd, "-h"))
		}
		if name == "zfs-controller" {
			subs := tlsCommands(helpOf(t, bin, "tls", "-h"))
			if len(subs) < 2 {
				t.Fatalf("zfs-controller tls -h names the tls commands %v: the parse of its usage is wrong", subs)
			}
			for _, sub := range subs {
				c.flags["tls "+sub] = flagsIn(helpOf(t, bin, "tls", sub, "-h"))
			}
		}
		clis[name] = c
	}
	return clis
}

// TestDocsNameWhatExists: every zfs-controller and zfs-node command line
// the docs show names a command the binary has and only flags that
// command takes; every make target they name is the Makefile's; every
// repository path and relative link leads to a file.
func TestDocsNameWhatExists(t *testing.T) {
	clis := build(t)
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeTarget.FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	checked := 0
	for file, doc := range sources(t) {
		for _, line := range codeOf(doc) {
			for _, words := range commandsIn(line) {
				switch name := filepath.Base(words[0]); {
				case clis[name].commands != nil:
					checked++
					for _, problem := range checkCommand(clis[name], words[1:]) {
						t.Errorf("%s: `%s`: %s", file, strings.Join(words, " "), problem)
					}
				case name == "make" && len(words) > 1:
					for _, w := range words[1:] {
						if !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") && !placeholder.MatchString(w) && !targets[w] {
							t.Errorf("%s: `%s`: the Makefile has no target %s", file, strings.Join(words, " "), w)
						}
					}
				}
			}
			for _, w := range strings.Fields(line) {
				checkPath(t, file, w)
			}
		}
		for _, m := range mdLink.FindAllStringSubmatch(doc, -1) {
			if target := m[1]; !strings.Contains(target, "://") && !strings.HasPrefix(target, "mailto:") {
				if _, err := os.Stat(filepath.Join(filepath.Dir(file), target)); err != nil {
					t.Errorf("%s: the link to %s leads to no file", file, target)
				}
			}
		}
	}
	t.Logf("%d command lines of zfs-controller and zfs-node checked", checked)
	if checked < 10 {
		t.Fatalf("only %d command lines of zfs-controller or zfs-node found in the docs: the parse is wrong", checked)
	}
}

// checkCommand checks a command line's arguments (after the binary's
// name) against what the binary says it takes.
func checkCommand(c cli, args []string) []string {
	if len(args) == 1 && strings.TrimLeft(args[0], "-") == "version" && strings.HasPrefix(args[0], "-") && c.version {
		return nil
	}
	if len(args) > 0 && slices.Contains(cmdline.LibraryFlags, args[0]) {
		return nil // the command-line library's own (-autocomplete-install)
	}
	if len(args) > 1 && args[0] == "help" {
		args = args[1:]
	}
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if placeholder.MatchString(args[0]) {
			return nil
		}
		if !c.commands[args[0]] {
			return []string{"no command " + args[0] + " (-h lists " + strings.Join(sortedKeys(c.commands), ", ") + ")"}
		}
		cmd, args = args[0], args[1:]
		if cmd == "tls" && len(args) > 0 && !strings.HasPrefix(args[0], "-") && !placeholder.MatchString(args[0]) {
			if c.flags["tls "+args[0]] == nil {
				return []string{"no tls command " + args[0]}
			}
			cmd, args = "tls "+args[0], args[1:]
		}
	}
	var problems []string
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" || strings.Trim(a, "-0123456789") == "" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" || placeholder.MatchString(name) {
			continue
		}
		if !c.flags[cmd][name] {
			problems = append(problems, "no flag -"+name+" for "+cmd)
		}
	}
	return problems
}

// checkPath reports a repository path the docs name that leads nowhere.
func checkPath(t *testing.T, file, word string) {
	t.Helper()
	p := strings.TrimRight(strings.Trim(word, `"'(),;`), ".:")
	p, _, _ = strings.Cut(p, "#")
	if !repoPath.MatchString(p) {
		return
	}
	if matches, _ := filepath.Glob(filepath.Join("..", p)); len(matches) > 0 {
		return
	}
	// A Go identifier in its package: internal/shared/tlsconfig.NewCA.
	if dir, ident, ok := strings.Cut(p, "."); ok && !strings.Contains(ident, "/") {
		if info, err := os.Stat(filepath.Join("..", dir)); err == nil && info.IsDir() {
			return
		}
	}
	t.Errorf("%s: %s: no such file in the repository", file, p)
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestCheckCommand: the check of a command line finds a wrong command or
// flag, and passes placeholders, arguments and --version.
func TestCheckCommand(t *testing.T) {
	c := cli{
		commands: map[string]bool{"serve": true, "promote": true, "tls": true},
		flags: map[string]map[string]bool{
			"serve":    {"config": true},
			"promote":  {"node": true, "force": true},
			"tls":      {},
			"tls cert": {"ca": true, "role": true},
		},
		version: true,
	}
	for _, tt := range []struct {
		line     string
		problems int
	}{
		{"zfs-controller promote -node n2 -force web-data", 0},
		{"zfs-controller promote web-data -force", 0},
		{"zfs-controller promote -nod n2 web-data", 1},
		{"zfs-controller promot web-data", 1},
		{"zfs-controller -config /etc/zfs-nomad.hcl", 0},
		{"zfs-controller -confg x", 1},
		{"zfs-controller tls cert -ca DIR -role node n1", 0},
		{"zfs-controller tls cert -ca DIR -days 30 n1", 1},
		{"zfs-controller tls certs -ca DIR n1", 1},
		{"zfs-controller COMMAND -h", 0},
		{"zfs-node --version", 0},
		{"zfs-controller promote [flags] VOLUME", 0},
	} {
		words := commandsIn(tt.line)[0]
		if got := checkCommand(c, words[1:]); len(got) != tt.problems {
			t.Errorf("%q: %v, want %d problems", tt.line, got, tt.problems)
		}
	}
}

// TestCodeOf: fenced lines lose their shell comments and join their
// continuations; inline spans naming Nomad's own source are left out.
func TestCodeOf(t *testing.T) {
	doc := "Run `make fast` first.\n\n```sh\nmake build   # only Go\nzfs-controller status \\\n  -json\n```\n" +
		"Nomad serialises them (Nomad's `nomad/csi_endpoint.go`).\n"
	got := codeOf(doc)
	want := []string{"make build", "zfs-controller status    -json", "", "make fast"}
	if !slices.Equal(got, want) {
		t.Errorf("codeOf: %q, want %q", got, want)
	}
}

// TestTLSCommands: the tls commands are read from its usage line, whose
// role list also holds bars.
func TestTLSCommands(t *testing.T) {
	help := "usage: zfs-controller tls ca [-days N] DIR | cert -ca DIR -role node|controller|operator|backup [-days N] [-out DIR] NAME | issue -ca DIR CLIENT...\n\nMake..."
	if got := tlsCommands(help); !slices.Equal(got, []string{"ca", "cert", "issue"}) {
		t.Errorf("tlsCommands: %q, want ca, cert and issue", got)
	}
}
