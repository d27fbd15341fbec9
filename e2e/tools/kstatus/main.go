// Command kstatus reads Kubernetes objects (a JSON array, or a List's items) on stdin and
// prints, per object, the status kstatus computes for it — the library Flux, `kubectl wait`
// and cli-utils appliers read health with — as one JSON line:
// {"kind": …, "name": …, "status": "Current|InProgress|Failed|Terminating|NotFound|Unknown", "message": …}.
//
// It is a test judge of protobot (operator/controller/tests/kstatus_health.rs), built by
// scripts/build-kstatus; it is never shipped.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Kind    string `json:"kind"`
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus: reading stdin:", err)
		os.Exit(2)
	}
	// Integers stay int64, as the API server's decoder gives them (kstatus reads
	// metadata.generation and status.observedGeneration as int64).
	var objects []map[string]interface{}
	if err := utiljson.Unmarshal(input, &objects); err != nil {
		var list struct {
			Items []map[string]interface{} `json:"items"`
		}
		if err2 := utiljson.Unmarshal(input, &list); err2 != nil {
			fmt.Fprintln(os.Stderr, "kstatus: stdin is neither a JSON array nor a List:", err)
			os.Exit(2)
		}
		objects = list.Items
	}
	out := json.NewEncoder(os.Stdout)
	for _, object := range objects {
		u := &unstructured.Unstructured{Object: object}
		result, err := status.Compute(u)
		v := verdict{Kind: u.GetKind(), Name: u.GetName()}
		if err != nil {
			v.Status = "Error"
			v.Message = err.Error()
		} else {
			v.Status = result.Status.String()
			v.Message = result.Message
		}
		if err := out.Encode(v); err != nil {
			fmt.Fprintln(os.Stderr, "kstatus: writing stdout:", err)
			os.Exit(2)
		}
	}
}
