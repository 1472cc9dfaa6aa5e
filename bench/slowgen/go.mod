module slowgen

go 1.21
