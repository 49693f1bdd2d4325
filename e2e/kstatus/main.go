// Command kstatus prints what cli-utils' kstatus (the status logic of Flux, cli-utils and
// `kubectl wait` on kstatus) concludes about Kubernetes objects given as JSON.
//
// Usage: kstatus [FILE ...]   (none, or "-": standard input)
//
//	kstatus -version            the cli-utils module this binary was built with
//
// Each input holds one or more JSON values: an object, an array of objects, or a list
// (`kubectl get -o json`, whose objects are in "items"). For every object one JSON line is
// printed: apiVersion, kind, namespace, name, and what status.Compute returned (status:
// Current, InProgress, Failed, Terminating; message; the standard conditions it derived).
// An object Compute cannot read gets an "error" field and the exit status is 1.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

const cliUtils = "sigs.k8s.io/cli-utils"

// verdict is one output line.
type verdict struct {
	APIVersion string             `json:"apiVersion"`
	Kind       string             `json:"kind"`
	Namespace  string             `json:"namespace,omitempty"`
	Name       string             `json:"name"`
	Status     status.Status      `json:"status,omitempty"`
	Message    string             `json:"message,omitempty"`
	Conditions []status.Condition `json:"conditions"`
	Error      string             `json:"error,omitempty"`
}

func main() {
	version := flag.Bool("version", false, "print the cli-utils module version and exit")
	flag.Parse()
	if *version {
		fmt.Println(cliUtilsVersion())
		return
	}
	paths := flag.Args()
	if len(paths) == 0 {
		paths = []string{"-"}
	}
	out := json.NewEncoder(os.Stdout)
	failed := false
	for _, path := range paths {
		objects, err := read(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kstatus: %s: %v\n", path, err)
			os.Exit(2)
		}
		for _, obj := range objects {
			v := compute(obj)
			failed = failed || v.Error != ""
			if err := out.Encode(v); err != nil {
				fmt.Fprintf(os.Stderr, "kstatus: %v\n", err)
				os.Exit(2)
			}
		}
	}
	if failed {
		os.Exit(1)
	}
}

func compute(obj map[string]interface{}) verdict {
	u := &unstructured.Unstructured{Object: obj}
	v := verdict{
		APIVersion: u.GetAPIVersion(),
		Kind:       u.GetKind(),
		Namespace:  u.GetNamespace(),
		Name:       u.GetName(),
		Conditions: []status.Condition{},
	}
	result, err := status.Compute(u)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.Status, v.Message = result.Status, result.Message
	if result.Conditions != nil {
		v.Conditions = result.Conditions
	}
	return v
}

// read returns the objects of every JSON value in the file, lists and arrays unpacked.
func read(path string) ([]map[string]interface{}, error) {
	var in io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		in = f
	}
	decoder := json.NewDecoder(bufio.NewReader(in))
	var objects []map[string]interface{}
	for {
		var raw json.RawMessage
		if err := decoder.Decode(&raw); errors.Is(err, io.EOF) {
			return objects, nil
		} else if err != nil {
			return nil, err
		}
		// apimachinery's decoder keeps integers as int64, which kstatus's field readers
		// require (encoding/json alone would give float64 generations).
		var value interface{}
		if err := utiljson.Unmarshal(raw, &value); err != nil {
			return nil, err
		}
		found, err := unpack(value)
		if err != nil {
			return nil, err
		}
		objects = append(objects, found...)
	}
}

func unpack(value interface{}) ([]map[string]interface{}, error) {
	switch v := value.(type) {
	case []interface{}:
		var objects []map[string]interface{}
		for _, item := range v {
			found, err := unpack(item)
			if err != nil {
				return nil, err
			}
			objects = append(objects, found...)
		}
		return objects, nil
	case map[string]interface{}:
		if items, ok := v["items"].([]interface{}); ok {
			if _, hasKind := v["kind"]; hasKind {
				return unpack(items)
			}
		}
		return []map[string]interface{}{v}, nil
	default:
		return nil, fmt.Errorf("expected a JSON object, array or list, got %T", value)
	}
}

func cliUtilsVersion() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return cliUtils + " (unknown)"
	}
	for _, dep := range info.Deps {
		if dep.Path == cliUtils {
			return dep.Path + " " + dep.Version
		}
	}
	return cliUtils + " (unknown)"
}
