package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/cmdline"
)

// TestTheDocsNameRealCommandsAndFlags: every zfs-controller command line
// the docs and the README show (in code spans and code blocks) names a
// command the binary has and flags that command reads, so a renamed
// flag cannot leave the guide behind.
func TestTheDocsNameRealCommandsAndFlags(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	checked := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range commandLines(string(data)) {
			if problem := checkCommandLine(line); problem != "" {
				t.Errorf("%s: %q: %s", filepath.Base(file), line, problem)
			}
			checked++
		}
	}
	if checked < 30 {
		t.Fatalf("found %d zfs-controller command lines in the docs, want more: is the pattern still right?", checked)
	}
}

var (
	codeSpan    = regexp.MustCompile("`[^`\n]+`")
	commandWord = regexp.MustCompile(`^(-|[a-z][a-z-]*$)`)
	invocation  = regexp.MustCompile(`(?:^|[\s(])zfs-controller((?:\s+[^\s|;&)]+)*)`)
)

// commandLines are the zfs-controller invocations in a Markdown file's
// code spans and code blocks, from the command to the first shell
// separator.
func commandLines(doc string) []string {
	var code []string
	inBlock := false
	for _, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock
		case inBlock:
			code = append(code, line)
		default:
			for _, span := range codeSpan.FindAllString(line, -1) {
				code = append(code, strings.Trim(span, "`"))
			}
		}
	}
	var out []string
	for _, c := range code {
		for _, m := range invocation.FindAllStringSubmatch(c, -1) {
			out = append(out, strings.TrimSpace(m[1]))
		}
	}
	return out
}

// checkCommandLine says what is wrong with the arguments of one
// invocation: a command the binary lacks, or a flag its command does not
// read. Placeholders (COMMAND, VOLUME) and usage lines are skipped.
func checkCommandLine(line string) string {
	args := strings.Fields(line)
	if len(args) > 1 && args[0] == "help" {
		args = args[1:]
	}
	switch {
	case len(args) == 0, strings.ToUpper(args[0]) == args[0] && !strings.HasPrefix(args[0], "-"):
		return "" // the binary alone, or a placeholder
	case !commandWord.MatchString(args[0]):
		return "" // a diagram's arrow
	}
	if strings.HasPrefix(args[0], "-") {
		if slices.Contains(cmdline.LibraryFlags, args[0]) {
			return ""
		}
		args = append([]string{"serve"}, args...)
	}
	name := args[0]
	if len(args) > 1 && isCommandName(name+" "+args[1]) {
		name += " " + args[1]
	}
	cmd, ok := commandNamed(name)
	if !ok {
		return "no such command"
	}
	flags := cmdline.Flags(libraryCommand(cmd))
	for _, arg := range args[1:] {
		flag, _, _ := strings.Cut(strings.TrimRight(arg, ".,:"), "=")
		if !strings.HasPrefix(flag, "-") || flag == "-" || flag == "--" || flag == "-h" || strings.ContainsAny(flag, "[]|") {
			continue
		}
		if _, ok := flags[flag]; !ok {
			return "zfs-controller " + name + " has no flag " + flag
		}
	}
	return ""
}

func isCommandName(name string) bool {
	_, ok := commandNamed(name)
	return ok
}

func commandNamed(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}
