// Command rigger-test-apiserver is a Kubernetes API server for Rigger's
// tests, built only from the Kubernetes libraries that are packaged
// (k8s.io/apiserver, apiextensions-apiserver, api, client-go), since neither
// kube-apiserver nor k8s.io/kubernetes can be had on the build machines.
// It serves CRDs exactly as Kubernetes does and the core kinds a node agent
// and its controller use, on etcd, with client-certificate authentication,
// AlwaysAllow authorization and the admission webhooks. There is no
// kubelet, scheduler or controller-manager behind it.
//
// See README.md beside this file for flags, kubeconfig and limits.
package main

import (
	goflag "flag"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/klog/v2"
)

func main() {
	o := NewOptions()
	fs := pflag.NewFlagSet("rigger-test-apiserver", pflag.ExitOnError)
	o.Run.AddUniversalFlags(fs)
	o.Recommended.AddFlags(fs)
	klogFlags := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fail(err)
	}
	if err := o.Run.ComponentGlobalsRegistry.Set(); err != nil {
		fail(err)
	}
	if err := o.Run.Complete(); err != nil {
		fail(err)
	}
	errs := append(o.Run.Validate(), o.Recommended.Validate()...)
	if err := utilerrors.NewAggregate(errs); err != nil {
		fail(err)
	}
	s, err := o.NewServer()
	if err != nil {
		fail(err)
	}
	if err := s.Run(genericapiserver.SetupSignalContext()); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "rigger-test-apiserver:", err)
	os.Exit(1)
}
