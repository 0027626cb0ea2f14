package main

// What kube-apiserver's controllers would otherwise provide: the default
// namespaces, and CRD groups in the unaggregated /apis list.

import (
	"context"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

var defaultNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// createDefaultNamespaces runs as a post-start hook, so /readyz only turns
// ready once they exist.
func createDefaultNamespaces(ctx genericapiserver.PostStartHookContext) error {
	client, err := kubernetes.NewForConfig(ctx.LoopbackClientConfig)
	if err != nil {
		return err
	}
	pending := append([]string(nil), defaultNamespaces...)
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(c context.Context) (bool, error) {
		var left []string
		for _, name := range pending {
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
			_, err := client.CoreV1().Namespaces().Create(c, ns, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				klog.V(2).Infof("creating namespace %s: %v (will retry)", name, err)
				left = append(left, name)
			}
		}
		pending = left
		return len(pending) == 0, nil
	})
}

// watchCRDGroups keeps the core server's unaggregated /apis group list in
// step with established CRDs. kube-apiserver gets this through the aggregator
// (an APIService per CRD group); clients that read the plain APIGroupList,
// such as kube-rs's Discovery, would otherwise never see CRD groups.
func watchCRDGroups(s *apiextensionsapiserver.CustomResourceDefinitions, groups discovery.GroupManager) {
	// apiextensions.k8s.io itself is served by the front server, which leaves
	// /apis to the core one
	groups.AddGroup(metav1.APIGroup{Name: apiextensionsv1.GroupName,
		Versions:         []metav1.GroupVersionForDiscovery{{GroupVersion: apiextensionsv1.SchemeGroupVersion.String(), Version: "v1"}},
		PreferredVersion: metav1.GroupVersionForDiscovery{GroupVersion: apiextensionsv1.SchemeGroupVersion.String(), Version: "v1"}})
	informer := s.Informers.Apiextensions().V1().CustomResourceDefinitions()
	var mu sync.Mutex
	added := map[string]bool{}
	resync := func() {
		mu.Lock()
		defer mu.Unlock()
		crds, err := informer.Lister().List(labels.Everything())
		if err != nil {
			return
		}
		versions := map[string]map[string]bool{}
		for _, crd := range crds {
			if !established(crd) {
				continue
			}
			for _, v := range crd.Spec.Versions {
				if v.Served {
					if versions[crd.Spec.Group] == nil {
						versions[crd.Spec.Group] = map[string]bool{}
					}
					versions[crd.Spec.Group][v.Name] = true
				}
			}
		}
		for g := range added {
			if versions[g] == nil {
				groups.RemoveGroup(g)
				delete(added, g)
			}
		}
		for g, vs := range versions {
			var names []string
			for v := range vs {
				names = append(names, v)
			}
			sort.Slice(names, func(i, j int) bool { return version.CompareKubeAwareVersionStrings(names[i], names[j]) > 0 })
			apiGroup := metav1.APIGroup{Name: g}
			for _, v := range names {
				apiGroup.Versions = append(apiGroup.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g + "/" + v, Version: v})
			}
			apiGroup.PreferredVersion = apiGroup.Versions[0]
			groups.AddGroup(apiGroup)
			added[g] = true
		}
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(interface{}) { resync() },
		UpdateFunc: func(interface{}, interface{}) { resync() },
		DeleteFunc: func(interface{}) { resync() },
	})
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
