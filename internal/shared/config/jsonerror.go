package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
)

// explainJSON turns a JSON decoding error of the config file data into
// one that names the line and column, and for a key the config does not
// know, the closest key it does know. offset is the decoder's position
// when it stopped, for errors that carry none.
func explainJSON(data []byte, offset int64, cfg any, err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		offset = syntax.Offset
	case errors.As(err, &typ):
		offset = typ.Offset
		err = fmt.Errorf("%s: want %s, not a JSON %s", typ.Field, typ.Type, typ.Value)
	default:
		if key, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			key = strings.Trim(key, `"`)
			if at := bytes.Index(data, []byte(`"`+key+`"`)); at >= 0 {
				offset = int64(at) + 1
			}
			err = fmt.Errorf("unknown key %q", key)
			if near := closest(key, jsonKeys(reflect.TypeOf(cfg))); near != "" {
				err = fmt.Errorf("unknown key %q; did you mean %q?", key, near)
			}
		}
	}
	line, col := position(data, offset)
	return fmt.Errorf("line %d, column %d: %w", line, col, err)
}

// position is the line and column (both from 1) of byte offset in data;
// json's offsets point just past the byte in question.
func position(data []byte, offset int64) (line, col int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	before := data[:max(offset-1, 0)]
	line = bytes.Count(before, []byte("\n")) + 1
	col = len(before) - bytes.LastIndexByte(before, '\n')
	return line, col
}

// jsonKeys lists the JSON keys of struct type t and of the structs it
// holds, at any depth.
func jsonKeys(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Map || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var keys []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		keys = append(keys, name)
		keys = append(keys, jsonKeys(t.Field(i).Type)...)
	}
	return keys
}

// closest is the key of keys nearest to s by edit distance, if it is
// near enough to be a misspelling (at most a third of its letters).
func closest(s string, keys []string) string {
	best, bestDist := "", len(s)/3+1
	for _, k := range keys {
		if d := editDistance(s, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
