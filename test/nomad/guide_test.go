package nomad

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The install guide's commands, as the Nomad test runs them: where
// docs/install.md gives a step as a command line, the test takes that
// line from the guide rather than writing it again, so a guide whose
// command stops working (a flag renamed, a job file moved, a variable
// gone) fails the test. The test changes only what its cluster makes
// different, each change named where it is made: the CA's and the
// output's directories, the clients' names, the job files' paths, the
// images' tags, and the flags it adds after the guide's (debug logs,
// its agent port).

// installGuide is docs/install.md.
const installGuide = "../../docs/install.md"

// guideLine is one command line of the guide, split as the shell splits
// it.
type guideLine []string

// guideLines are the command lines of the guide's sh blocks, in order,
// without their comments.
func guideLines(t testing.TB) []guideLine {
	t.Helper()
	data, err := os.ReadFile(installGuide)
	if err != nil {
		t.Fatal(err)
	}
	var out []guideLine
	inShell := false
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "```sh":
			inShell = true
		case strings.HasPrefix(trimmed, "```"):
			inShell = false
		case inShell && trimmed != "" && !strings.HasPrefix(trimmed, "#"):
			if words := shellWords(trimmed); len(words) > 0 {
				out = append(out, words)
			}
		}
	}
	return out
}

// shellWords splits a command line as the shell does for the guide's
// lines: words separated by blanks, single and double quotes grouping,
// and an unquoted # starting a comment.
func shellWords(line string) []string {
	var words []string
	var word strings.Builder
	inWord, quote := false, rune(0)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			word.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			return words
		case r == ' ' || r == '\t':
			if inWord {
				words, inWord = append(words, word.String()), false
				word.Reset()
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, word.String())
	}
	return words
}

// guideCommand is the one line of the guide that holds every one of
// words as a word; the test fails when the guide has none or several.
func guideCommand(t testing.TB, words ...string) guideLine {
	t.Helper()
	var found []guideLine
	for _, l := range guideLines(t) {
		if !slices.ContainsFunc(words, func(w string) bool { return !slices.Contains(l, w) }) {
			found = append(found, l)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s has %d command lines with the words %q, want one: the test runs the guide's line", filepath.Base(installGuide), len(found), words)
	}
	return found[0]
}

// replace returns the line with every word old replaced by new; the
// test fails when the line has no such word, since then the guide says
// something the test does not follow.
func (l guideLine) replace(t testing.TB, old string, new ...string) guideLine {
	t.Helper()
	i := slices.Index(l, old)
	if i < 0 {
		t.Fatalf("the guide's line %q has no word %q to replace", strings.Join(l, " "), old)
	}
	return slices.Concat(l[:i], new, l[i+1:])
}

// replacePrefix replaces the one word that begins with prefix.
func (l guideLine) replacePrefix(t testing.TB, prefix string, new ...string) guideLine {
	t.Helper()
	i := slices.IndexFunc(l, func(w string) bool { return strings.HasPrefix(w, prefix) })
	if i < 0 {
		t.Fatalf("the guide's line %q has no word beginning %q to replace", strings.Join(l, " "), prefix)
	}
	return l.replace(t, l[i], new...)
}

// before inserts words before the last one (a command's file).
func (l guideLine) before(words ...string) guideLine {
	return slices.Concat(l[:len(l)-1], words, l[len(l)-1:])
}

// TestGuideLines: the guide's lines split as the shell would, and the
// commands the Nomad test takes from it are there, once each.
func TestGuideLines(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"nomad job run -var 'image=${meta.x}' f.hcl", []string{"nomad", "job", "run", "-var", "image=${meta.x}", "f.hcl"}},
		{`a "b c" d   # a comment`, []string{"a", "b c", "d"}},
		{"make build    # needs Go", []string{"make", "build"}},
		{"x=y#z", []string{"x=y#z"}},
	} {
		if got := shellWords(tc.line); !slices.Equal(got, tc.want) {
			t.Errorf("shellWords(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
	for _, words := range guideSteps {
		guideCommand(t, words...)
	}
}

// guideSteps are the words that find each guide line the test runs.
var guideSteps = [][]string{
	{"zfs-controller", "tls", "issue"},
	{"nomad", "job", "run", "image=${meta.zfs_nomad_node_image}", "nomad/zfs-node.nomad.hcl"},
	{"nomad", "job", "run", "nomad/zfs-controller.nomad.hcl"},
	{"nomad", "volume", "create"},
	{"nomad", "job", "run", "nomad/example-job.nomad.hcl"},
}
