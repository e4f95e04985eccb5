package main

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// TestKubeClientAsksForProtobuf: the daemon's Kubernetes client asks for
// protobuf (JSON as the fallback) and decodes a protobuf answer, without
// gzip unless --kube-api-compression; a content type the user's config
// names stays.
func TestKubeClientAsksForProtobuf(t *testing.T) {
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	var mu sync.Mutex
	var accept, encodings []string
	// TLS, as every real API server: client-go honours DisableCompression
	// only in the transports it builds, not in http.DefaultTransport,
	// which it uses for a plain-HTTP host.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accept = append(accept, r.Header.Get("Accept"))
		encodings = append(encodings, r.Header.Get("Accept-Encoding"))
		mu.Unlock()
		list := &corev1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"},
			Items: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"}}}}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
		enc := codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
		if err := enc.Encode(list, w); err != nil {
			t.Errorf("encode: %v", err)
		}
	}))
	defer srv.Close()

	list := func(gzip bool) {
		t.Helper()
		cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})}}
		tuneKubeClient(cfg, config{KubeQPS: 20, KubeBurst: 40, KubeCompression: gzip})
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cs.CoreV1().Services("shop").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		if len(got.Items) != 1 || got.Items[0].Name != "web" {
			t.Fatalf("decoded %+v", got.Items)
		}
	}
	list(false)
	list(true) // --kube-api-compression
	mu.Lock()
	defer mu.Unlock()
	want := runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if len(accept) != 2 || accept[0] != want || accept[1] != want {
		t.Errorf("Accept headers %q, want %q twice", accept, want)
	}
	// gzip only when asked for: the lists of a start cost both sides
	// gzip's CPU for traffic that stays in the cluster.
	if len(encodings) != 2 || encodings[0] != "" || encodings[1] != "gzip" {
		t.Errorf("Accept-Encoding %q, want none by default and gzip with --kube-api-compression", encodings)
	}

	mine := &rest.Config{ContentConfig: rest.ContentConfig{ContentType: runtime.ContentTypeJSON, AcceptContentTypes: runtime.ContentTypeJSON}}
	preferProtobuf(mine)
	if mine.ContentType != runtime.ContentTypeJSON || mine.AcceptContentTypes != runtime.ContentTypeJSON {
		t.Errorf("the config's own content types were replaced: %q, %q", mine.ContentType, mine.AcceptContentTypes)
	}
}
