package volumelog

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

func TestLinesNameTheirVolume(t *testing.T) {
	web, db, other := contract.VolumeIDForName("web"), contract.VolumeIDForName("db"), contract.VolumeIDForName("other")
	Learn(web, "web")
	Learn(db, "db")
	Learn("", "nobody")
	Learn(other, "")
	Learn(other, "web") // not other's name: its digest is web's ID
	tests := []struct {
		name          string
		log           func(l hclog.Logger)
		want, notWant []string
	}{
		{name: "an ID on the line", log: func(l hclog.Logger) { l.Info("staged", "volume_id", web) },
			want: []string{"volume_id=" + web + " volume_name=web"}},
		{name: "an ID on the logger", log: func(l hclog.Logger) { l.With("volume_id", db).Named("push").Warn("send failed", "bytes", 3) },
			want: []string{"volume_id=" + db + " bytes=3 volume_name=db"}},
		{name: "the line's ID wins over the logger's", log: func(l hclog.Logger) { l.With("volume_id", db).Info("also", "volume_id", web) },
			want: []string{"volume_name=web"}, notWant: []string{"volume_name=db"}},
		{name: "a name already on the line", log: func(l hclog.Logger) { l.Info("created", "volume_id", web, "volume_name", "web") },
			want: []string{"volume_id=" + web + " volume_name=web\n"}},
		{name: "a name already on the logger", log: func(l hclog.Logger) {
			l.With("volume_id", web, "volume_name", "web").ResetNamed("x").Info("created")
		}, want: []string{"volume_id=" + web + " volume_name=web\n"}},
		{name: "an ID never learned", log: func(l hclog.Logger) { l.Error("gone", "volume_id", contract.VolumeIDForName("never")) },
			want: []string{"volume_id=" + contract.VolumeIDForName("never") + "\n"}, notWant: []string{"volume_name"}},
		{name: "an ID learned without its name", log: func(l hclog.Logger) { l.Debug("x", "volume_id", other) },
			notWant: []string{"volume_name"}},
		{name: "no volume", log: func(l hclog.Logger) { l.Trace("beat", "peers", 2) },
			notWant: []string{"volume_name"}},
		{name: "an odd argument list is left as it is", log: func(l hclog.Logger) { l.Info("odd", "volume_id", web, "lonely") },
			notWant: []string{"volume_name"}},
		{name: "at any level", log: func(l hclog.Logger) { l.Log(hclog.Warn, "moved", "volume_id", db) },
			want: []string{"[WARN]", "volume_name=db"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			l := Logger(hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Trace}))
			tt.log(l)
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("line %q lacks %q", out.String(), w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("line %q holds %q", out.String(), w)
				}
			}
		})
	}
}

func TestLoggerWrapsOnce(t *testing.T) {
	l := Logger(hclog.NewNullLogger())
	if _, ok := Logger(l).(naming); !ok {
		t.Fatal("Logger of a naming logger is not a naming logger")
	}
	if n := Logger(l).(naming); n.Logger != l.(naming).Logger {
		t.Error("Logger wrapped a naming logger again")
	}
}
