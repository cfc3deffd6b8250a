//go:build tools

// Package tools pins the versions of the development tools (make check,
// make proto) in this module's go.mod, apart from the driver's own.
package tools

import (
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
	_ "honnef.co/go/tools/cmd/staticcheck"
)
