// Command extproc-descriptors writes, to stdout, the FileDescriptorSet (binary protobuf) of Envoy's ext-proc
// service (envoy.service.ext_proc.v3) and every file it imports, dependencies first, taken from the very Go
// packages the EPP is built with. The cluster tier's gateway client (tests/support/cluster/extproc.py) builds
// its messages from it, so it speaks exactly the protocol version of the EPP it drives, with no stubs to keep.
package main

import (
	"os"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

func main() {
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(protoreflect.FileDescriptor)
	add = func(file protoreflect.FileDescriptor) {
		if seen[file.Path()] {
			return
		}
		seen[file.Path()] = true
		imports := file.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(file))
	}
	add(extprocv3.File_envoy_service_ext_proc_v3_external_processor_proto)
	encoded, err := proto.Marshal(set)
	if err != nil {
		os.Stderr.WriteString("marshal the descriptor set: " + err.Error() + "\n")
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(encoded); err != nil {
		os.Exit(1)
	}
}
