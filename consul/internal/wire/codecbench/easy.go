package codecbench

import "github.com/fleetsync/fleetsync/consul/internal/wire"

// easyjson generates code only for types of the package it runs on: these
// name the lean types here (go generate writes easy_easyjson.go).

//go:generate go run github.com/mailru/easyjson/easyjson@v0.9.2 easy.go

//easyjson:json
type easyNodeServices wire.NodeServices

//easyjson:json
type easyChecks []*wire.Check

//easyjson:json
type easyTxnResponse wire.TxnResponse
