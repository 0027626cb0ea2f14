package main

// The server chain, as kube-apiserver builds it from one set of options:
// apiextensions-apiserver (CRDs) in front, delegating everything it does not
// serve to the core server; both share authentication, authorization,
// admission, the loopback client and the aggregated discovery manager.

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/emicklei/go-restful/v3"
	noopoteltrace "go.opentelemetry.io/otel/trace/noop"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apiextensionsoptions "k8s.io/apiextensions-apiserver/pkg/cmd/server/options"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	apimachineryversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/discovery/aggregated"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kube-openapi/pkg/builder"
	"k8s.io/kube-openapi/pkg/builder3"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/common/restfuladapter"
	"k8s.io/kube-openapi/pkg/handler"
	netutils "k8s.io/utils/net"
)

type Options struct {
	Run         *genericoptions.ServerRunOptions
	Recommended *genericoptions.RecommendedOptions
}

func NewOptions() *Options {
	ro := genericoptions.NewRecommendedOptions("/registry", Codecs.LegacyCodec(servedGroupVersions...))
	// AlwaysAllow: a nil authorization option means exactly that in ApplyTo
	ro.Authorization = nil
	// client certificates only (--client-ca-file); no TokenReview, no lookup
	// of kube-system/extension-apiserver-authentication
	ro.Authentication.RemoteKubeConfigFileOptional = true
	ro.Authentication.SkipInClusterLookup = true
	// informers come from the loopback client (see applyRecommended), not --kubeconfig
	ro.CoreAPI = nil
	// flowcontrol.apiserver.k8s.io is not served
	ro.Features.EnablePriorityAndFairness = false
	// the policy plugins need APIs this server does not serve
	ro.Admission.DisablePlugins = []string{"ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"}
	ro.SecureServing.BindPort = 6443
	ro.Etcd.StorageConfig.Transport.ServerList = []string{"http://127.0.0.1:2379"}
	return &Options{Run: genericoptions.NewServerRunOptions(), Recommended: ro}
}

// server is the running chain.
type server struct {
	top, core *genericapiserver.GenericAPIServer
	openAPIV2 *common.Config
	openAPIV3 *common.OpenAPIV3Config
}

func (o *Options) NewServer() (*server, error) {
	if err := o.Recommended.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil,
		[]net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("self-signed certificate: %w", err)
	}
	cfg := genericapiserver.NewRecommendedConfig(Codecs)
	if err := o.Run.ApplyTo(&cfg.Config); err != nil {
		return nil, err
	}
	cfg.EffectiveVersion = gitVersioned{cfg.EffectiveVersion}
	namer := openapinamer.NewDefinitionNamer(namerScheme, apiextensionsapiserver.Scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(getOpenAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title = "Kubernetes"
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(getOpenAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "Kubernetes"
	// one manager, so CRD groups show up in the aggregated /apis next to the core groups
	cfg.AggregatedDiscoveryGroupManager = aggregated.NewResourceManager("apis")
	if err := o.applyRecommended(cfg); err != nil {
		return nil, err
	}
	resources := serverstorage.NewResourceConfig()
	resources.EnableVersions(servedGroupVersions...)
	cfg.MergedResourceConfig = resources

	apiextCfg, err := o.apiextensionsConfig(cfg)
	if err != nil {
		return nil, err
	}

	core, err := cfg.Complete().New("rigger-test-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, err
	}
	if err := installCoreAPIs(core, cfg.RESTOptionsGetter); err != nil {
		return nil, err
	}
	core.AddPostStartHookOrDie("rigger-default-namespaces", createDefaultNamespaces)

	apiext, err := apiextCfg.Complete().New(core)
	if err != nil {
		return nil, err
	}
	watchCRDGroups(apiext, core.DiscoveryGroupManager)
	return &server{top: apiext.GenericAPIServer, core: core, openAPIV2: cfg.OpenAPIConfig, openAPIV3: cfg.OpenAPIV3Config}, nil
}

// applyRecommended is RecommendedOptions.ApplyTo, except that the client
// for informers and admission plugins is the server's own loopback client
// (CoreAPIOptions would want a kubeconfig or an in-cluster service account).
func (o *Options) applyRecommended(cfg *genericapiserver.RecommendedConfig) error {
	ro := o.Recommended
	if err := ro.Etcd.ApplyTo(&cfg.Config); err != nil {
		return err
	}
	if err := ro.EgressSelector.ApplyTo(&cfg.Config); err != nil {
		return err
	}
	if err := ro.Traces.ApplyTo(cfg.Config.EgressSelector, &cfg.Config); err != nil {
		return err
	}
	if err := ro.SecureServing.ApplyToConfig(&cfg.Config); err != nil {
		return err
	}
	if err := ro.Authentication.ApplyTo(&cfg.Config.Authentication, cfg.SecureServing, cfg.OpenAPIConfig); err != nil {
		return err
	}
	if err := ro.Authorization.ApplyTo(&cfg.Config.Authorization); err != nil { // nil: AlwaysAllow
		return err
	}
	if err := ro.Audit.ApplyTo(&cfg.Config); err != nil {
		return err
	}
	cfg.ClientConfig = cfg.LoopbackClientConfig
	kubeClient, err := kubernetes.NewForConfig(cfg.LoopbackClientConfig)
	if err != nil {
		return err
	}
	dynamicClient, err := dynamic.NewForConfig(cfg.LoopbackClientConfig)
	if err != nil {
		return err
	}
	cfg.SharedInformerFactory = informers.NewSharedInformerFactory(kubeClient, 10*time.Minute)
	if err := ro.Features.ApplyTo(&cfg.Config, kubeClient, cfg.SharedInformerFactory); err != nil {
		return err
	}
	return ro.Admission.ApplyTo(&cfg.Config, cfg.SharedInformerFactory, kubeClient, dynamicClient, ro.FeatureGate, cfg.EffectiveVersion)
}

// apiextensionsConfig mirrors kube-apiserver's CreateAPIExtensionsConfig: a
// shallow copy of the core config with CRD storage codecs and no hooks.
func (o *Options) apiextensionsConfig(cfg *genericapiserver.RecommendedConfig) (*apiextensionsapiserver.Config, error) {
	generic := cfg.Config
	generic.PostStartHooks = map[string]genericapiserver.PostStartHookConfigEntry{}
	generic.RESTOptionsGetter = nil
	etcd := *o.Recommended.Etcd
	etcd.StorageConfig.Codec = apiextensionsapiserver.Codecs.LegacyCodec(apiextensionsv1beta1.SchemeGroupVersion, apiextensionsv1.SchemeGroupVersion)
	etcd.StorageConfig.EncodeVersioner = runtime.NewMultiGroupVersioner(apiextensionsv1beta1.SchemeGroupVersion,
		schema.GroupKind{Group: apiextensionsv1beta1.GroupName})
	etcd.SkipHealthEndpoints = true // the core config already checks etcd
	if err := etcd.ApplyTo(&generic); err != nil {
		return nil, err
	}
	generic.MergedResourceConfig = apiextensionsapiserver.DefaultAPIResourceConfigSource()
	services := cfg.SharedInformerFactory.Core().V1().Services().Lister()
	return &apiextensionsapiserver.Config{
		GenericConfig: &genericapiserver.RecommendedConfig{Config: generic, SharedInformerFactory: cfg.SharedInformerFactory},
		ExtraConfig: apiextensionsapiserver.ExtraConfig{
			CRDRESTOptionsGetter: apiextensionsoptions.NewCRDRESTOptionsGetter(etcd, generic.ResourceTransformers, generic.StorageObjectCountTracker),
			MasterCount:          1,
			ServiceResolver:      serviceResolver{services},
			AuthResolverWrapper: webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, cfg.LoopbackClientConfig,
				noopoteltrace.NewTracerProvider()),
		},
	}, nil
}

// serviceResolver resolves conversion webhooks given as services (as apiextensions' own does).
type serviceResolver struct{ services corelisters.ServiceLister }

func (r serviceResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return proxy.ResolveCluster(r.services, namespace, name, port)
}

func installCoreAPIs(s *genericapiserver.GenericAPIServer, optsGetter generic.RESTOptionsGetter) error {
	groups := map[string]*genericapiserver.APIGroupInfo{}
	var order []string
	for _, k := range kinds {
		info, ok := groups[k.gv.Group]
		if !ok {
			i := genericapiserver.NewDefaultAPIGroupInfo(k.gv.Group, Scheme, metav1.ParameterCodec, Codecs)
			info = &i
			groups[k.gv.Group] = info
			order = append(order, k.gv.Group)
		}
		main, status, err := newStorage(k, optsGetter)
		if err != nil {
			return err
		}
		m := info.VersionedResourcesStorageMap[k.gv.Version]
		if m == nil {
			m = map[string]rest.Storage{}
			info.VersionedResourcesStorageMap[k.gv.Version] = m
		}
		m[k.resource] = main
		if status != nil {
			m[k.resource+"/status"] = status
		}
	}
	if err := s.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, groups[""]); err != nil {
		return err
	}
	var infos []*genericapiserver.APIGroupInfo
	for _, g := range order {
		if g != "" {
			infos = append(infos, groups[g])
		}
	}
	return s.InstallAPIGroups(infos...)
}

// Run prepares the chain, publishes the core models through the front
// server's OpenAPI endpoints, and serves until ctx ends.
func (s *server) Run(ctx context.Context) error {
	prepared := s.top.PrepareRun()
	if err := s.publishOpenAPI(); err != nil {
		return err
	}
	return prepared.RunWithContext(ctx)
}

// publishOpenAPI: each server of the chain installs /openapi/v2 and v3 for
// its own routes, and the front one (apiextensions) shadows the core one.
// kube-apiserver's aggregator merges them; here the front server's services
// are given the core routes too. The CRD OpenAPI controllers, started later,
// merge CRD models into the same services (v2 from StaticOpenAPISpec).
func (s *server) publishOpenAPI() error {
	seen := map[string]bool{}
	var all []*restful.WebService
	for _, srv := range []*genericapiserver.GenericAPIServer{s.core, s.top} {
		for _, ws := range srv.Handler.GoRestfulContainer.RegisteredWebServices() {
			if !seen[ws.RootPath()] {
				seen[ws.RootPath()] = true
				all = append(all, ws)
			}
		}
	}
	v2, err := builder.BuildOpenAPISpecFromRoutes(restfuladapter.AdaptWebServices(all), s.openAPIV2)
	if err != nil {
		return fmt.Errorf("openapi v2: %w", err)
	}
	v2.Definitions = handler.PruneDefaults(v2.Definitions)
	s.top.StaticOpenAPISpec = v2
	if err := s.top.OpenAPIVersionedService.UpdateSpec(v2); err != nil {
		return err
	}
	for _, ws := range s.core.Handler.GoRestfulContainer.RegisteredWebServices() {
		gv := strings.TrimPrefix(ws.RootPath(), "/")
		if !strings.HasPrefix(gv, "api/") && !strings.HasPrefix(gv, "apis/") {
			continue
		}
		v3, err := builder3.BuildOpenAPISpecFromRoutes(restfuladapter.AdaptWebServices([]*restful.WebService{ws}), s.openAPIV3)
		if err != nil {
			return fmt.Errorf("openapi v3 %s: %w", gv, err)
		}
		s.top.OpenAPIV3VersionedService.UpdateGroupVersion(gv, v3)
	}
	return nil
}

// gitVersioned reports a parseable version on /version: the git version is
// normally stamped in by kube's build scripts (-ldflags), and without it is
// "v0.0.0-master+$Format:%H$", which kubectl refuses.
type gitVersioned struct {
	basecompatibility.EffectiveVersion
}

func (v gitVersioned) Info() *apimachineryversion.Info {
	info := v.EffectiveVersion.Info()
	if info != nil && strings.HasPrefix(info.GitVersion, "v0.0.0") {
		info.GitVersion = fmt.Sprintf("v%s.%s.0", info.Major, info.Minor)
		info.GitTreeState = "clean"
	}
	return info
}
